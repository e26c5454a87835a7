"""The rows ``python -m trainkit.predict`` reads from a table: .npy, .npz, .csv, and one line per unusable file."""
import numpy as np

from trainkit.data.predict_inputs import image_samples, table_samples


def _samples(paths, shape=(2, 3)):
    return list(table_samples([str(p) for p in paths], lambda row: row * 2.0, shape, "an input"))


def test_rows_of_npy_npz_and_csv_are_read_in_order_and_prepared(tmp_path):
    """Mutation caught: ``yield ..., row, None`` (prepare not applied) and a header row taken as data."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 2, 3))
    np.save(tmp_path / "a.npy", rows)
    np.savez(tmp_path / "b.npz", features=rows[:2], labels=np.arange(2))
    lines = ["a,b,c,d,e,f"] + [",".join(repr(float(v)) for v in row.ravel()) for row in rows[2:]]
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    got = _samples([tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.csv"])
    ids = [item[0] for item in got]
    assert ids == [f"{tmp_path}/a.npy:{i}" for i in range(4)] + [f"{tmp_path}/b.npz:{i}" for i in range(2)] + [
        f"{tmp_path}/c.csv:{i}" for i in range(2)]
    expected = np.concatenate([rows, rows[:2], rows[2:]]) * 2.0
    np.testing.assert_allclose(np.stack([item[1] for item in got]), expected)
    assert all(item[2] is None for item in got)


def test_a_bad_file_gets_one_line_and_the_rest_goes_on(tmp_path):
    """Mutation caught: raising on the first bad file instead of yielding its line."""
    np.save(tmp_path / "good.npy", np.ones((2, 6)))  # flat rows: reshaped to (2, 3)
    np.save(tmp_path / "wide.npy", np.ones((2, 7)))
    (tmp_path / "words.csv").write_text("1,2,3,4,5,6\n1,2,x,4,5,6\n")
    (tmp_path / "ragged.csv").write_text("1,2,3,4,5,6\n1,2\n")
    got = _samples([tmp_path / "missing.npy", tmp_path / "wide.npy", tmp_path / "words.csv", tmp_path / "ragged.csv",
                    tmp_path / "good.npy"])
    errors = [item[2] for item in got if item[2] is not None]
    assert len(errors) == 4 and all("\n" not in e for e in errors)
    assert errors[0] == f"{tmp_path}/missing.npy does not exist"
    assert "(7,)" in errors[1] and "(2, 3)" in errors[1]
    assert "row 1" in errors[2] and "columns" in errors[3]
    good = [item for item in got if item[2] is None]
    assert [item[0] for item in good] == [f"{tmp_path}/good.npy:0", f"{tmp_path}/good.npy:1"]
    np.testing.assert_allclose(good[0][1], np.full((2, 3), 2.0))


def test_images_and_folders_are_decoded_and_a_bad_image_is_one_line(tmp_path):
    """PNG pixels come back exactly; a truncated JPEG, a file that is no image and a folder without images are one
    line each, and the rest goes on. Mutation caught: Decode(to_pil=False) (a truncated JPEG kills the process with
    SIGFPE in MindSpore 2.10: the test run dies) and folders not searched below their top level."""
    from PIL import Image

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    (tmp_path / "photos" / "nested").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    Image.fromarray(pixels[0]).save(tmp_path / "photos" / "a.png")
    Image.fromarray(pixels[1]).save(tmp_path / "photos" / "nested" / "b.png")
    (tmp_path / "photos" / "notes.txt").write_text("not an image, and not an image suffix: passed over")
    Image.fromarray(pixels[0]).save(tmp_path / "whole.jpg", quality=95)
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(data[:len(data) // 2])
    (tmp_path / "text.png").write_text("not an image")
    inputs = [tmp_path / "truncated.jpg", tmp_path / "photos", tmp_path / "text.png", tmp_path / "empty",
              tmp_path / "gone.png"]
    got = list(image_samples([str(p) for p in inputs], lambda image: image, channels=3))
    assert [item[0] for item in got] == [str(tmp_path / "truncated.jpg"), str(tmp_path / "photos" / "a.png"),
                                         str(tmp_path / "photos" / "nested" / "b.png"), str(tmp_path / "text.png"),
                                         str(tmp_path / "empty"), str(tmp_path / "gone.png")]
    np.testing.assert_array_equal(got[1][1], pixels[0])
    np.testing.assert_array_equal(got[2][1], pixels[1])
    errors = [item[2] for item in got if item[2] is not None]
    assert errors[0].startswith(f"{tmp_path}/truncated.jpg cannot be read as an image (")
    assert errors[1].startswith(f"{tmp_path}/text.png cannot be read as an image (")
    assert errors[2].startswith(f"{tmp_path}/empty holds no image files")
    assert errors[3] == f"{tmp_path}/gone.png does not exist"
    gray = list(image_samples([str(tmp_path / "photos" / "a.png")], lambda image: image, channels=1))
    assert gray[0][1].shape == (5, 7, 1)


def test_cifar10_prepares_an_image_file_as_its_evaluation_set(tmp_path):
    """Pixels / 255, normalised with CIFAR-10's mean and std, CHW: NumPy here. Mutation caught: the training
    augmentations (random crop, flip) applied to a prediction's image (``_image_ops(train=True)``)."""
    from PIL import Image

    from trainkit.data.cifar10 import MEAN, STD, Cifar10Data

    pixels = np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "cat.png")
    np.save(tmp_path / "rows.npy", pixels[None].astype(np.float64))
    data = Cifar10Data(root=str(tmp_path / "no_data"), image_size=32)
    expected = ((pixels / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(2, 0, 1)
    got = list(data.predict_samples([str(tmp_path / "cat.png"), str(tmp_path / "rows.npy")]))
    assert [item[0] for item in got] == [str(tmp_path / "cat.png"), f"{tmp_path}/rows.npy:0"]
    for _, image, error in got:
        assert error is None
        np.testing.assert_allclose(image, expected, atol=1e-5)
