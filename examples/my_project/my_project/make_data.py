"""``python -m my_project.make_data OUT.npz``: a small image dataset to train on, in the format `NpzImages` reads.

Three classes of 8x8 grayscale images, a bright horizontal, vertical or diagonal line on noise; stands in for
your own data, exported once to NumPy arrays.
"""
import sys
from pathlib import Path

import numpy as np

SIZE, PER_CLASS = 8, 200


def make_images(per_class: int = PER_CLASS, seed: int = 0):
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label in range(3):
        for _ in range(per_class):
            image = rng.normal(0.0, 0.3, size=(SIZE, SIZE))
            at = rng.integers(SIZE)
            if label == 0:
                image[at, :] += 1.0
            elif label == 1:
                image[:, at] += 1.0
            else:
                image[np.arange(SIZE), (np.arange(SIZE) + at) % SIZE] += 1.0
            images.append(image[None])
            labels.append(label)
    return np.stack(images).astype(np.float32), np.array(labels, np.int32)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m my_project.make_data OUT.npz", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    images, labels = make_images()
    np.savez(out, images=images, labels=labels)
    print(f"wrote {out}: {len(images)} images {'x'.join(map(str, images.shape[1:]))}, {labels.max() + 1} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
