"""Image files checked before anything compiles: each one a line naming the file when the decoder would fail.

Pillow opens and fully decodes each file once (a truncated JPEG or PNG fails there, as MindSpore's ``Decode``
would fail in the middle of an epoch); the training itself reads the files with MindSpore. Formats are those
MindSpore's ``vision.Decode`` reads into arrays: JPEG, PNG, BMP and TIFF, by their usual extensions (lower or
upper case, as ``ImageFolderDataset`` is told to read).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

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
    """The files of a class folder to check, sorted by name (as ``ImageFolderDataset`` reads them): every file but
    a hidden one without an image extension (``.DS_Store``). A hidden file named as an image (macOS's
    ``._photo.jpg``) is kept: ``ImageFolderDataset`` would read it."""
    return sorted((p for p in folder.iterdir() if p.is_file() and
                   (not p.name.startswith(".") or p.suffix in EXTENSIONS or p.suffix in _UPPER)), key=lambda p: p.name)


def _image_module():
    try:
        from PIL import Image
    except ImportError as error:  # pragma: no cover - Pillow comes with MindSpore
        raise DataError("checking image files needs Pillow, which is not installed: pip install Pillow") from error
    return Image


def check_image(path: Path) -> int:
    """The channels of image `path`; DataError, one line naming it, when the decoder would not read it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    suffix = path.suffix
    if suffix.lower() not in FORMATS:
        raise DataError(f"{path}: {suffix or 'a file without an extension'} is not a format the image decoder reads "
                        f"({', '.join(EXTENSIONS)}); convert it, or move it out of the class folder")
    if suffix not in (suffix.lower(), suffix.upper()):
        raise DataError(f"{path}: name it with {suffix.lower()} or {suffix.upper()} (mixed-case extensions are not "
                        "read)")
    image_module = _image_module()
    try:
        with image_module.open(path) as image:
            found = image.format
            mode = image.mode
            image.load()  # decodes every pixel: a truncated file fails here
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
