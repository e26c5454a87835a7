"""data=image_folder: a folder of class folders trains through the app, splits as documented, predicts with the
evaluation transforms, and every bad file is refused in one line naming it before anything compiles."""
import json

import mindspore as ms
import numpy as np
import pytest

from tests.common.image_folders import write_folder, write_image
from tests.common.transcripts import run_in_process
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.data.image_folder import ImageFolderData
from trainkit.tools.evaluate import main as evaluate

COUNTS = {"cat": 10, "dog": 8, "emu": 6}


def batches(dataset):
    return list(dataset.create_dict_iterator(output_numpy=True, num_epochs=1))


def test_a_jpeg_and_png_folder_trains_through_the_app(graph_mode, tmp_path, capsys):
    """One epoch of the light preset on 24 images of 3 classes; the class names reach the run and its
    checkpoints, and evaluate's JSON and printout name the classes by them (per-class accuracy, the confusion
    matrix's rows), the checkpoint's own names first, not the folders' names now.

    Mutation caught: evaluate ignoring the stored names (per-class accuracy by index)."""
    root = write_folder(tmp_path / "images", COUNTS)
    result = train(compose_config([
        "data=image_folder", f"data.root={root}", "data.image_size=8", "data.batch_size=4", "data.augment=light",
        "data.num_parallel_workers=1", "model.width=4", "trainer.epochs=1", "logger=quiet", "trainer.test=true",
        f"run_dir={tmp_path / 'run'}"]))
    assert result.data.class_names == sorted(COUNTS)
    assert json.loads((tmp_path / "run" / "class_names.json").read_text()) == sorted(COUNTS)
    best = ms.load_checkpoint(str(tmp_path / "run" / "checkpoints" / "best.ckpt"))
    assert json.loads(str(best["trainkit_class_names"])) == sorted(COUNTS)
    assert result.metrics["optimizer_steps"] == 4  # 18 images left after a test and a validation one per class
    assert 0.0 <= result.metrics["test_accuracy"] <= 1.0
    (tmp_path / "run" / "class_names.json").write_text('["not", "these", "names"]')
    for name in COUNTS:  # the stored names, not the folder's
        (root / name).rename(root / name.upper())
    assert evaluate([str(tmp_path / "run"), "--output", str(tmp_path / "eval.json"), "--split", "test"]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["class_names"] == sorted(COUNTS)
    printed = capsys.readouterr().out.splitlines()
    accuracy = evaluated["per_class_accuracy"]
    assert f"per-class accuracy: cat: {accuracy[0]:.3f}, dog: {accuracy[1]:.3f}, emu: {accuracy[2]:.3f}" in printed
    title = "confusion matrix (rows: true class, columns: predicted, in the order cat, dog, emu):"
    rows = printed[printed.index(title) + 1:][:3]
    assert [row.split()[0] for row in rows] == sorted(COUNTS)


def test_one_folder_is_carved_per_class_by_fraction_and_seed(tmp_path):
    """Per class: round(fraction * count) test images, then as many validation ones, at least one each, chosen by
    split_seed; the rest train. Checked against the labels the pipeline reads."""
    write_folder(tmp_path / "images", COUNTS)
    (tmp_path / "images" / "dog" / ".DS_Store").write_bytes(b"Finder's")  # hidden, not an image: ignored
    data = ImageFolderData(tmp_path / "images", image_size=8, batch_size=2, val_fraction=0.2, test_fraction=0.3,
                           num_parallel_workers=1)
    data.prepare()
    sizes = {split: np.bincount(data.split_labels(split), minlength=3) for split in ("train", "val", "test")}
    expected_test = [round(0.3 * n) for n in (10, 8, 6)]  # cat, dog, emu: 3, 2, 2
    expected_val = [round(0.2 * n) for n in (10, 8, 6)]  # 2, 2, 1
    np.testing.assert_array_equal(sizes["test"], expected_test)
    np.testing.assert_array_equal(sizes["val"], expected_val)
    np.testing.assert_array_equal(sizes["train"], np.array([10, 8, 6]) - expected_test - expected_val)
    read = np.concatenate([b["label"] for b in batches(data.eval_dataset())])
    np.testing.assert_array_equal(read, data.split_labels("val"))
    again = ImageFolderData(tmp_path / "images", image_size=8, val_fraction=0.2, test_fraction=0.3)
    again.prepare()
    other = ImageFolderData(tmp_path / "images", image_size=8, val_fraction=0.2, test_fraction=0.3, split_seed=1)
    other.prepare()
    assert [list(s.rows) for s in again._splits.values()] == [list(s.rows) for s in data._splits.values()]
    assert [list(s.rows) for s in other._splits.values()] != [list(s.rows) for s in data._splits.values()]


def test_train_val_test_folders_are_used_as_they_are(tmp_path):
    root = tmp_path / "images"
    write_folder(root / "train", {"cat": 4, "dog": 4})
    write_folder(root / "val", {"dog": 3}, seed=1)  # a split may lack a class
    write_folder(root / "test", {"cat": 2, "dog": 1}, seed=2)
    data = ImageFolderData(root, image_size=8, batch_size=2, num_parallel_workers=1)
    data.prepare()
    assert data.class_names == ["cat", "dog"]
    assert [len(data.split_labels(s)) for s in ("train", "val", "test")] == [8, 3, 3]
    assert [list(b["label"]) for b in batches(data.eval_dataset())] == [[1, 1], [1]]
    assert np.concatenate([b["label"] for b in batches(data.test_dataset())]).tolist() == [0, 0, 1]


def test_predictions_get_the_evaluation_transforms_never_the_augmentations(tmp_path):
    """Mutation caught: predict_samples built with image_ops(train=True) (random crops: the images differ)."""
    root = write_folder(tmp_path / "images", COUNTS)
    data = ImageFolderData(root, image_size=8, batch_size=2, augment="randaugment", num_parallel_workers=1,
                           val_fraction=0.2, test_fraction=0.2)
    data.prepare()
    val = np.concatenate([b["image"] for b in batches(data.eval_dataset())])
    split = data._splits["val"]
    files = [sorted((root / name).iterdir()) for name in sorted(COUNTS)]
    paths = [str(p) for p in sorted(sum(files, []), key=lambda p: (p.parent.name, p.name))]
    chosen = [paths[i] for i in split.rows]
    predicted = list(data.predict_samples(chosen + [str(tmp_path / "missing.png")]))
    assert [p[0] for p in predicted[:-1]] == chosen and all(p[2] is None for p in predicted[:-1])
    np.testing.assert_array_equal(np.stack([p[1] for p in predicted[:-1]]), val)
    assert predicted[-1] == (str(tmp_path / "missing.png"), None, f"{tmp_path / 'missing.png'} does not exist")
    train_images = np.concatenate([b["image"] for b in batches(data.train_dataset())])
    assert train_images.shape[1:] == val.shape[1:]


def truncated(path):
    write_image(path, np.random.default_rng(1), size=(40, 40))
    path.write_bytes(path.read_bytes()[:200])


def not_an_image(path):
    path.write_bytes(b"these are not the pixels you are looking for")


def a_gif(path):
    write_image(path, np.random.default_rng(1), fmt="GIF")


@pytest.mark.parametrize("make, name, message", [
    (truncated, "dog/bad.jpg", "{path} is unreadable or truncated ("),
    (truncated, "dog/bad.png", "{path} is unreadable or truncated ("),
    (not_an_image, "dog/bad.png", "{path} is not an image the decoder reads (JPEG, PNG, BMP, TIFF)"),
    (a_gif, "dog/anim.gif", "{path}: .gif is not a format the image decoder reads"),
    (a_gif, "dog/anim.png", "{path} holds a GIF image, a format the decoder does not read"),
    (lambda p: write_image(p, np.random.default_rng(1), mode="L"), "dog/grey.png",
     "{path} has 1 channel, but 6 other images have 3 (e.g. "),
    (lambda p: p.mkdir(), "fox", "{path} is an empty class folder"),
    (not_an_image, "dog/._img000.jpg", "{path} is not an image the decoder reads"),  # macOS's AppleDouble file
], ids=["truncated_jpeg", "truncated_png", "not_an_image", "gif_extension", "gif_content", "mixed_channels",
        "empty_class", "hidden_image_name"])
def test_a_bad_file_is_refused_in_one_line_naming_it_before_compiling(tmp_path, monkeypatch, make, name, message):
    """Mutations caught: check_image without image.load() (only the header read): the truncated PNG passes the
    check (red); image_files leaving out every hidden file: ImageFolderDataset still reads ._img000.jpg (red)."""
    root = write_folder(tmp_path / "images", {"cat": 3, "dog": 3})
    path = root / name
    make(path)
    monkeypatch.chdir(tmp_path)
    printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"data.root={root}",
                              "data.image_size=8", f"hydra.run.dir={tmp_path / 'run'}"])
    assert printed.status == 2, printed.stderr
    assert printed.stderr.count("\n") == 1 and printed.stderr.startswith("trainkit: error: "), printed.stderr
    assert message.format(path=path) in printed.stderr
    assert not (tmp_path / "run" / ".hydra").exists()  # nothing written: refused before the run started


def test_layout_errors_name_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def refused(root):
        printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"data.root={root}",
                                  f"hydra.run.dir={tmp_path / 'run'}"])
        assert printed.status == 2 and printed.stderr.count("\n") == 1, printed.stderr
        return printed.stderr

    assert f"data.root={tmp_path / 'nowhere'} is not a folder" in refused(tmp_path / "nowhere")
    (tmp_path / "flat").mkdir()
    write_image(tmp_path / "flat" / "a.png", np.random.default_rng(0))
    assert f"{tmp_path / 'flat'} holds no class folders" in refused(tmp_path / "flat")
    write_folder(tmp_path / "split" / "train", {"cat": 2, "dog": 2})
    write_folder(tmp_path / "split" / "val", {"cow": 2})
    assert f"{tmp_path / 'split' / 'val' / 'cow'} is a class folder that" in refused(tmp_path / "split")
    printed = run_in_process(["python", "-m", "trainkit", "data=image_folder", f"hydra.run.dir={tmp_path / 'run'}"])
    assert "data.root must be the folder of class folders (data.root=DIR); got None" in printed.stderr


def test_the_augmentations_draw_the_same_whatever_the_worker_count(tmp_path):
    """data.num_parallel_workers is a key a resume may change (trainkit.app.resume_policy.DATA_KEYS_FREE), so the
    random ops must not depend on it. Mutation caught: the random stage mapped with num_parallel_workers threads
    (MindSpore gives each thread its own stream: 1 and 2 workers differ, red)."""
    import mindspore.dataset as ds

    root = write_folder(tmp_path / "images", COUNTS)
    images = {}
    for workers in (1, 2):
        ds.config.set_seed(5)
        data = ImageFolderData(root, image_size=8, batch_size=4, augment="strong", num_parallel_workers=workers)
        images[workers] = [b["image"] for b in batches(data.train_dataset())]
    assert all(np.array_equal(a, b) for a, b in zip(images[1], images[2]))

