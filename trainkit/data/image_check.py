"""Image files checked before anything compiles: each one a line naming the file when the decoder would fail.

Pillow opens and fully decodes each file once (a truncated JPEG or PNG fails there, as MindSpore's ``Decode``
would fail in the middle of an epoch); the training itself reads the files with MindSpore. Formats are those
MindSpore's ``vision.Decode`` reads into arrays: JPEG, PNG, BMP and TIFF, by their usual extensions (lower or
upper case, as ``ImageFolderDataset`` is told to read).

Every entry of a class folder that ``ImageFolderDataset`` would read is checked, not only regular files: a FIFO,
socket or device (or a link to one) and a folder named like an image are refused, naming them, as they would hang
or break the run (:mod:`trainkit.data.input_file` opens each file). An image of more pixels than Pillow's
``Image.MAX_IMAGE_PIXELS`` (89,478,485 unless changed: a decompression bomb, a few KB of PNG claiming 20000x20000)
is refused before it is decoded.
"""
from __future__ import annotations

import contextlib
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Sequence, Tuple

from trainkit.data.input_file import open_input
from trainkit.errors import DataError

# extension -> the format Pillow must find in the file
FORMATS: Dict[str, str] = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF",
                           ".tiff": "TIFF"}
EXTENSIONS = tuple(FORMATS)
_UPPER = tuple(e.upper() for e in EXTENSIONS)
# Pillow's mode -> the channels it holds ("P": a palette of colours, "1": one bit per pixel)
_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "F": 1, "P": 3, "LA": 2, "PA": 4, "RGB": 3, "YCbCr": 3, "LAB": 3,
             "HSV": 3, "RGBA": 4, "RGBX": 4, "CMYK": 4}


def image_files(folder: Path) -> List[Path]:
    """The entries of a class folder to check, sorted by name (as ``ImageFolderDataset`` reads them): every entry
    but a hidden one without an image extension (``.DS_Store``) and a folder without one. A hidden file named as an
    image (macOS's ``._photo.jpg``) is kept, and so is a FIFO, socket, device, dangling link or folder named as one:
    ``ImageFolderDataset`` would read it (:func:`check_image` refuses what is not a regular file)."""
    def read(path: Path) -> bool:
        image_name = path.suffix in EXTENSIONS or path.suffix in _UPPER
        return (image_name or not path.name.startswith(".")) and (image_name or not path.is_dir())

    return sorted((p for p in folder.iterdir() if read(p)), key=lambda p: p.name)


def _image_module():
    try:
        from PIL import Image
    except ImportError as error:  # pragma: no cover - Pillow comes with MindSpore
        raise DataError("checking image files needs Pillow, which is not installed: pip install Pillow") from error
    return Image


def _quiet_bomb_warning(image_module) -> None:
    """Pillow warns of an image past MAX_IMAGE_PIXELS as it opens it: every such image is refused in its own line
    (:func:`opened_image`), so the warning would only be a second message. A filter, added when absent (a
    ``warnings.catch_warnings`` block may have dropped it): catch_warnings itself is not thread-safe, and
    check_images opens files in threads; adding it at every call would reset other warnings' once-only records."""
    if ("ignore", None, image_module.DecompressionBombWarning, None, 0) not in warnings.filters:
        warnings.filterwarnings("ignore", category=image_module.DecompressionBombWarning)


@contextlib.contextmanager
def opened_image(stream: BinaryIO, path: Path) -> Iterator[Any]:
    """Pillow's ``Image.open(stream)`` (the header read, no pixel decoded), refused in one line naming `path` when
    the image has more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS`` (None: no bound).

    Raises:
        DataError: the image is too large; Pillow's own errors (not an image, a bad header) pass through.
    """
    image_module = _image_module()
    limit = image_module.MAX_IMAGE_PIXELS
    _quiet_bomb_warning(image_module)
    try:
        image = image_module.open(stream)
    except image_module.DecompressionBombError as error:  # more than twice the bound: Pillow's own refusal
        found = re.search(r"\((\d+) pixels\)", str(error))
        pixels = f"{int(found.group(1)):,} pixels" if found else f"more than {2 * (limit or 0):,} pixels"
        raise DataError(_too_large(path, pixels, limit)) from error
    with image:
        width, height = image.size
        if limit is not None and width * height > limit:
            raise DataError(_too_large(path, f"{width * height:,} pixels ({width}x{height})", limit))
        yield image


def _too_large(path: Path, pixels: str, limit: int) -> str:
    return (f"{path} has {pixels}, more than the {limit:,} trainkit decodes (PIL.Image.MAX_IMAGE_PIXELS; a "
            "decompression bomb?): resize it, or remove it")


def check_image(path: Path) -> int:
    """The channels of image `path`; DataError, one line naming it, when the decoder would not read it."""
    path = Path(path)
    with open_input(path) as stream:  # first: a FIFO named x.jpg is refused as what it is
        return _check_image(stream, path)


def _check_image(stream: BinaryIO, path: Path) -> int:
    suffix = path.suffix
    if suffix.lower() not in FORMATS:
        raise DataError(f"{path}: {suffix or 'a file without an extension'} is not a format the image decoder reads "
                        f"({', '.join(EXTENSIONS)}); convert it, or move it out of the class folder")
    if suffix not in (suffix.lower(), suffix.upper()):
        raise DataError(f"{path}: name it with {suffix.lower()} or {suffix.upper()} (mixed-case extensions are not "
                        "read)")
    image_module = _image_module()
    try:
        with opened_image(stream, path) as image:
            found = image.format
            mode = image.mode
            image.load()  # decodes every pixel: a truncated file fails here
    except DataError:
        raise
    except image_module.UnidentifiedImageError as error:
        raise DataError(f"{path} is not an image the decoder reads (JPEG, PNG, BMP, TIFF): its content is no "
                        "known image format") from error
    except (OSError, SyntaxError, ValueError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise DataError(f"{path} is unreadable or truncated ({reason}): replace or remove it") from error
    expected = FORMATS[suffix.lower()]
    if found != expected:
        if found not in FORMATS.values():
            raise DataError(f"{path} holds a {found} image, a format the decoder does not read (JPEG, PNG, BMP, "
                            "TIFF): convert it")
        raise DataError(f"{path} holds a {found} image under a {suffix} name: rename it "
                        f"(.{found.lower().replace('jpeg', 'jpg')})")
    return _CHANNELS.get(mode, 3)


def check_images(paths: Sequence[Path], threads: int) -> List[Tuple[Path, int]]:
    """:func:`check_image` of every path, in `threads` threads (Pillow decodes without the GIL: about 3 ms per
    256x320 JPEG on one core); the first bad file in `paths` order is the one named."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, os.cpu_count() or 1))) as pool:
        return list(zip(paths, pool.map(check_image, paths)))


def check_channels(channels: Sequence[Tuple[Path, int]]) -> None:
    """Refuse images of different channel counts (a grayscale scan among colour photos), naming the first image of
    the rarer count and one of the commoner."""
    files: Dict[int, List[Path]] = {}
    for path, count in channels:
        files.setdefault(count, []).append(path)
    if len(files) > 1:
        common, rare = sorted(files, key=lambda c: (-len(files[c]), c))[:2]
        raise DataError(f"{files[rare][0]} has {rare} channel{'s' * (rare > 1)}, but {len(files[common])} other "
                        f"images have {common} (e.g. {files[common][0]}): the images mix channel counts; convert "
                        "them all to one mode (e.g. RGB)")
