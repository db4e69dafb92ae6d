"""The wire: the one kind of queue that carries items between the stages of a pipeline.

Every boundary of a pipeline (source to first stage, stage to stage, last stage to the
consumer) is a :class:`~.channel.Channel`, served from threads and coroutines alike.
"""
