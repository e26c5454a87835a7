"""Download, MD5 check and safe extraction, served from a loopback HTTP server: the tests never leave 127.0.0.1."""
import functools
import io
import os
import socket
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tests.common.cifar10_files import make_cifar10_archive, make_tar_gz, write_cifar10
from trainkit.data.cifar10 import Cifar10Data
from trainkit.data.download import download_file, extract_tar
from trainkit.errors import DataError

ARCHIVE = "cifar-10-binary.tar.gz"
SEED = 7


class _Handler(SimpleHTTPRequestHandler):
    """Static files, plus /truncated: announces 1000 bytes, sends 10 and closes."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/truncated":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, MD5 of the served CIFAR-10 archive): a generated archive served on 127.0.0.1."""
    served = tmp_path_factory.mktemp("served")
    md5 = make_cifar10_archive(str(served / ARCHIVE), seed=SEED)
    (served / "not-a-tar.tar.gz").write_bytes(b"<html>Error page</html>")
    make_tar_gz(str(served / "wrong-layout.tar.gz"), {"some-folder/data_batch_1.bin": b"\0" * 3073})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", md5
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{ARCHIVE}"


def leftovers(root) -> list:
    """Files anywhere under root that are temporaries of a download or an extraction."""
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in files + dirs
            if n.endswith(".part") or n.startswith(".cifar10-extract-")]


def expected_test_images(tmp_path) -> dict:
    return write_cifar10(str(tmp_path / "expected"), seed=SEED)


# --------------------------------------------------------------------------------------------- Cifar10Data.prepare
def test_download_verifies_extracts_and_the_dataset_reads(server, tmp_path, capsys):
    url, md5 = server
    root = tmp_path / "data"
    data = Cifar10Data(str(root), download=True, url=f"{url}/{ARCHIVE}", md5=md5, image_size=32, eval_batch_size=16)
    data.prepare()
    progress = capsys.readouterr().err.splitlines()  # to stderr, not a TTY here: one line per 10%, no repeat
    assert progress[-1].startswith(f"Downloading {url}/{ARCHIVE}: 100% (") and len(progress) == len(set(progress))
    assert sorted(os.listdir(root / "cifar-10-batches-bin")) == [
        "batches.meta.txt", *(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"]
    assert (root / ARCHIVE).is_file() and not leftovers(root)
    (images, labels), = data.test_dataset().create_tuple_iterator(output_numpy=True, num_epochs=1)
    np.testing.assert_array_equal(labels, expected_test_images(tmp_path)["test_labels"])
    assert images.shape == (16, 3, 32, 32)


def test_wrong_md5_names_both_digests_and_leaves_nothing_that_looks_valid(server, tmp_path):
    url, md5 = server
    root = tmp_path / "data"
    wrong = "0" * 32
    data = Cifar10Data(str(root), download=True, url=f"{url}/{ARCHIVE}", md5=wrong)
    with pytest.raises(DataError) as err:
        data.prepare()
    message = str(err.value)
    assert f"MD5 mismatch for {url}/{ARCHIVE}: expected {wrong}, got {md5}" in message
    assert not (root / ARCHIVE).exists() and not (root / "cifar-10-batches-bin").exists()
    assert not leftovers(root)
    with pytest.raises(DataError, match="does not exist"):  # and a later run without download still says so
        Cifar10Data(str(root)).prepare()


def test_unreachable_url_says_how_to_fix(tmp_path):
    root = tmp_path / "data"
    url = closed_port_url()
    with pytest.raises(DataError) as err:
        Cifar10Data(str(root), download=True, url=url).prepare()
    message = str(err.value)
    assert f"Could not download {url}" in message and "network" in message
    assert f"extract it into {root}" in message and not leftovers(root)


def test_http_error_is_reported_with_its_status(server, tmp_path):
    url, _ = server
    with pytest.raises(DataError, match=r"Could not download .*/missing\.tar\.gz: HTTP Error 404"):
        Cifar10Data(str(tmp_path), download=True, url=f"{url}/missing.tar.gz").prepare()


def test_server_sending_html_instead_of_the_archive(server, tmp_path):
    url, _ = server
    with pytest.raises(DataError) as err:
        Cifar10Data(str(tmp_path), download=True, url=f"{url}/not-a-tar.tar.gz", md5=None).prepare()
    assert f"Could not extract {tmp_path / ARCHIVE}: it is damaged or not a tar archive (ReadError" in str(err.value)
    assert f"It came from {url}/not-a-tar.tar.gz" in str(err.value) and "has been deleted" in str(err.value)
    assert os.listdir(tmp_path) == []  # no archive to be reused by the next run, no partial folder


def test_archive_without_the_batches_folder_is_refused(server, tmp_path):
    url, _ = server
    with pytest.raises(DataError, match="has no top-level cifar-10-batches-bin/ folder"):
        Cifar10Data(str(tmp_path), download=True, url=f"{url}/wrong-layout.tar.gz", md5=None).prepare()
    assert os.listdir(tmp_path) == []


def test_an_archive_already_in_root_is_extracted_without_the_network(tmp_path):
    md5 = make_cifar10_archive(str(tmp_path / ARCHIVE), seed=SEED)
    message = str(pytest.raises(DataError, Cifar10Data(str(tmp_path)).prepare).value)
    assert f"{tmp_path / ARCHIVE} exists: data.download=true verifies and extracts it" in message
    Cifar10Data(str(tmp_path), download=True, url=closed_port_url(), md5=md5).prepare()  # no server: no download
    Cifar10Data(str(tmp_path)).prepare()


def test_download_replaces_a_corrupt_file(server, tmp_path):
    url, md5 = server
    write_cifar10(str(tmp_path), seed=SEED)
    bad = tmp_path / "cifar-10-batches-bin" / "data_batch_5.bin"
    bad.write_bytes(b"\1" * 100)
    Cifar10Data(str(tmp_path), download=True, url=f"{url}/{ARCHIVE}", md5=md5).prepare()
    assert bad.stat().st_size == 8 * 3073


# ------------------------------------------------------------------------------------------------ download_file
def test_truncated_transfer_is_an_error_and_leaves_no_file(server, tmp_path):
    url, _ = server
    dest = tmp_path / "file.bin"
    with pytest.raises(DataError, match=f"{url}/truncated"):
        download_file(f"{url}/truncated", str(dest), progress=None)
    assert os.listdir(tmp_path) == []


def test_download_file_returns_the_md5_and_reports_progress(server, tmp_path):
    url, md5 = server
    stream = io.StringIO()
    assert download_file(f"{url}/{ARCHIVE}", str(tmp_path / "a.tar.gz"), md5.upper(), progress=stream) == md5
    assert stream.getvalue().splitlines()[-1].startswith(f"Downloading {url}/{ARCHIVE}: 100% (")


# -------------------------------------------------------------------------------------------------- extract_tar
@pytest.mark.parametrize("name", ["../evil.txt", "/tmp/evil.txt", "cifar-10-batches-bin/../../evil.txt"])
def test_extract_refuses_paths_outside_the_folder(tmp_path, name):
    archive = str(tmp_path / "evil.tar.gz")
    make_tar_gz(archive, {"cifar-10-batches-bin/ok.bin": b"ok", name: b"evil"})
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DataError, match="points outside the extraction folder"):
        extract_tar(archive, str(dest))
    assert os.listdir(dest) == [] and not (tmp_path / "evil.txt").exists()


def test_extract_refuses_links(tmp_path):
    archive = str(tmp_path / "link.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DataError, match="is a link or special file"):
        extract_tar(archive, str(dest))
    assert os.listdir(dest) == []
