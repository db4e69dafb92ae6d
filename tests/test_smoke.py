from torch_spdl.pipeline import PipelineBuilder


def test_spdl_intro_example():
    pipeline = (
        PipelineBuilder()
        .add_source(range(12))
        .pipe(lambda x: 2 * x)
        .pipe(lambda x: x + 1)
        .aggregate(3)
        .add_sink(3)
        .build(num_threads=1)
    )
    with pipeline.auto_stop():
        assert list(pipeline) == [[1, 3, 5], [7, 9, 11], [13, 15, 17], [19, 21, 23]]
