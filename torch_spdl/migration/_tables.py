"""What the migration tool recognises: I/O calls, handles, random number sources.

Names are fully qualified (``PIL.Image.open``, not ``Image.open``): the tool resolves each
call through the module's imports first (see :mod:`._names`).
"""

from __future__ import annotations

__all__ = [
    "IO_FUNCTIONS",
    "IO_METHODS",
    "HANDLE_OPENERS",
    "RNG_CONSTRUCTORS",
    "SHARED_RNG_MODULES",
    "TORCH_RANDOM",
    "TRIVIAL_CALLS",
    "MUTATING_METHODS",
    "DATASET_BASES",
    "ITERABLE_BASES",
    "DATALOADER_NAMES",
    "LIBRARY_LOADERS",
]

# Calls that read from files, URLs or remote stores.
IO_FUNCTIONS: frozenset[str] = frozenset(
    {
        "open",
        "io.open",
        "os.read",
        "os.pread",
        "gzip.open",
        "bz2.open",
        "lzma.open",
        "tarfile.open",
        "zipfile.ZipFile",
        "pickle.load",
        "json.load",
        "PIL.Image.open",
        "numpy.load",
        "numpy.fromfile",
        "numpy.loadtxt",
        "numpy.genfromtxt",
        "numpy.memmap",
        "torch.load",
        "torchvision.io.read_file",
        "torchvision.io.read_image",
        "torchvision.io.read_video",
        "torchvision.datasets.folder.default_loader",
        "torchvision.datasets.folder.pil_loader",
        "torchaudio.load",
        "cv2.imread",
        "cv2.imreadmulti",
        "cv2.VideoCapture",
        "av.open",
        "h5py.File",
        "soundfile.read",
        "scipy.io.wavfile.read",
        "scipy.io.loadmat",
        "librosa.load",
        "imageio.imread",
        "imageio.v3.imread",
        "skimage.io.imread",
        "tifffile.imread",
        "pandas.read_csv",
        "pandas.read_parquet",
        "pandas.read_json",
        "pyarrow.parquet.read_table",
        "urllib.request.urlopen",
        "urllib.request.urlretrieve",
        "requests.get",
        "requests.post",
        "requests.request",
        "httpx.get",
        "httpx.post",
        "http.client.HTTPConnection",
        "http.client.HTTPSConnection",
        "boto3.client",
        "boto3.resource",
        "lmdb.open",
        "torch_spdl.io.load_image",
        "torch_spdl.io.load_audio",
        "torch_spdl.io.load_video",
    }
)

# Method names that read, whatever the receiver (``path.read_bytes()``, ``f.read()``).
IO_METHODS: frozenset[str] = frozenset(
    {
        "read",
        "read1",
        "readinto",
        "readline",
        "readlines",
        "read_bytes",
        "read_text",
        "recv",
        "urlopen",
        "getresponse",
        "get_object",
        "download_file",
        "download_fileobj",
        "download_as_bytes",
        "download_as_string",
        "download_to_filename",
        "imread",
    }
)

# Calls whose result is a handle: subscripting it or calling its methods reads
# (``self.h5["images"][i]``, ``self.mm[i]``, ``session.get(url)``).
HANDLE_OPENERS: frozenset[str] = frozenset(
    {
        "open",
        "io.open",
        "gzip.open",
        "bz2.open",
        "lzma.open",
        "tarfile.open",
        "zipfile.ZipFile",
        "h5py.File",
        "numpy.memmap",
        "numpy.lib.format.open_memmap",
        "av.open",
        "cv2.VideoCapture",
        "lmdb.open",
        "requests.Session",
        "httpx.Client",
        "urllib3.PoolManager",
        "urllib.request.urlopen",
        "http.client.HTTPConnection",
        "http.client.HTTPSConnection",
        "boto3.client",
        "boto3.resource",
        "boto3.Session",
        "google.cloud.storage.Client",
        "sqlite3.connect",
    }
)

# Calls that make a generator object: one made inside ``__getitem__`` is per sample.
RNG_CONSTRUCTORS: frozenset[str] = frozenset(
    {
        "random.Random",
        "random.SystemRandom",
        "numpy.random.default_rng",
        "numpy.random.Generator",
        "numpy.random.RandomState",
        "numpy.random.PCG64",
        "numpy.random.SeedSequence",
        "torch.Generator",
    }
)

# Modules whose functions draw from a process-wide generator.
SHARED_RNG_MODULES: tuple[str, ...] = ("random.", "numpy.random.")

# torch functions that draw from torch's global generator unless given ``generator=``.
TORCH_RANDOM: frozenset[str] = frozenset(
    {
        "torch.rand",
        "torch.randn",
        "torch.randint",
        "torch.randperm",
        "torch.rand_like",
        "torch.randn_like",
        "torch.randint_like",
        "torch.bernoulli",
        "torch.multinomial",
        "torch.normal",
        "torch.poisson",
        "torch.manual_seed",
        "torch.seed",
    }
)

# Calls that are bookkeeping, not CPU work worth a stage of its own.
TRIVIAL_CALLS: frozenset[str] = frozenset(
    {
        "len",
        "range",
        "enumerate",
        "zip",
        "int",
        "float",
        "str",
        "bytes",
        "bool",
        "list",
        "tuple",
        "dict",
        "set",
        "sorted",
        "reversed",
        "min",
        "max",
        "sum",
        "abs",
        "round",
        "isinstance",
        "getattr",
        "print",
        "append",
        "extend",
        "insert",
        "add",
        "update",
        "format",
        "join",
        "split",
        "strip",
        "items",
        "keys",
        "values",
        "get",
        "pathlib.Path",
        "pathlib.PurePath",
        "seek",
        "tell",
        "close",
    }
)

# Methods that change the object they are called on.
MUTATING_METHODS: frozenset[str] = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "add",
        "discard",
        "update",
        "setdefault",
        "sort",
        "reverse",
    }
)

DATASET_BASES: frozenset[str] = frozenset(
    {"torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset"}
)
ITERABLE_BASES: frozenset[str] = frozenset(
    {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
)
DATALOADER_NAMES: frozenset[str] = frozenset(
    {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
)

_TORCH_LOOKUP = (
    "torch.utils.data.DataLoader = torch_spdl.DataLoader  (timm looks the class up on "
    "torch.utils.data each time it builds a loader)"
)


def _bound_at_import(module: str) -> str:
    return f"{module}.DataLoader = torch_spdl.DataLoader  ({module} bound torch's class at import)"


# Calls that build torch's DataLoader inside a library, where the import swap cannot reach:
# the qualified name -> the one line (run before the call) that makes it build ours.
LIBRARY_LOADERS: dict[str, str] = {
    "timm.data.create_loader": _TORCH_LOOKUP,
    "timm.data.loader.create_loader": _TORCH_LOOKUP,
    **{
        f"{package}.LightningDataModule.from_datasets": _bound_at_import(f"{core}.core.datamodule")
        for package, core in (
            ("lightning", "lightning.pytorch"),
            ("lightning.pytorch", "lightning.pytorch"),
            ("lightning.pytorch.core", "lightning.pytorch"),
            ("lightning.pytorch.core.datamodule", "lightning.pytorch"),
            ("pytorch_lightning", "pytorch_lightning"),
            ("pytorch_lightning.core", "pytorch_lightning"),
        )
    },
    "transformers.Trainer": _bound_at_import("transformers.trainer"),
    "transformers.trainer.Trainer": _bound_at_import("transformers.trainer"),
}
