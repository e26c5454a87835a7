"""Every rank starts from the same step, weights, optimizer state and decisive config, or none trains: the start
signature (trainkit/distributed/agreement.py) and a 2-worker job whose ranks resume from different checkpoints."""
import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.distributed import test_launch
from tests.distributed.test_launch import REPO, STEPS_PER_EPOCH, WORKERS, tiny
from trainkit.app.config import compose_config
from trainkit.distributed.agreement import decode, disagreement, encode, start_signature
from trainkit.distributed.launch import free_port

cifar10 = test_launch.cifar10  # the fixture


def config(*overrides):
    return compose_config(["recipe=resnet50_cifar10", "model=small_cnn", "parallel=data_parallel", "run_dir=/unused",
                           *overrides])


PARAMETERS = [("network.w", np.arange(6, dtype=np.float32).reshape(2, 3)), ("optimizer.moment", np.ones(3))]


def test_the_signature_travels_exactly_through_float32():
    """Mutation caught: 24-bit chunks (float32 rounds them) made the decoded values differ."""
    signature = start_signature(123456789, PARAMETERS, config())
    vector = encode(signature)
    assert vector.dtype == np.float32
    assert decode(vector.astype(np.float32), list(signature)) == signature
    expected = hashlib.blake2b(digest_size=8)  # the weights' value, computed here independently
    for name, value in sorted(PARAMETERS):
        expected.update(name.encode() + str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
    assert signature["weights and optimizer state"] == int.from_bytes(expected.digest(), "little")


def test_one_bit_of_one_weight_changes_the_weights_value_only():
    changed = [(name, value.copy()) for name, value in PARAMETERS]
    changed[1][1][2] = np.nextafter(1.0, 2.0)
    first, second = start_signature(0, PARAMETERS, config()), start_signature(0, changed, config())
    assert [name for name in first if first[name] != second[name]] == ["weights and optimizer state"]


@pytest.mark.parametrize("override, group", [("optimizer.lr=0.002", "optimizer"), ("data.batch_size=8", "data"),
                                             ("trainer.seed=1", "trainer"), ("parallel.nodes=2", "parallel")])
def test_a_decisive_key_changes_its_group(override, group):
    first, second = start_signature(0, PARAMETERS, config()), start_signature(0, PARAMETERS, config(override))
    assert [name for name in first if first[name] != second[name]] == [f"config {group}"]


@pytest.mark.parametrize("override", ["data.root=/elsewhere", "data.num_parallel_workers=7", "trainer.resume=auto",
                                      "parallel.node_rank=0", "parallel.master_addr=10.0.0.1", "logger.progress=log"])
def test_what_may_differ_between_machines_does_not(override):
    assert start_signature(0, PARAMETERS, config()) == start_signature(0, PARAMETERS, config(override))


def test_the_message_names_the_first_differing_rank_and_what_differs():
    agree = {"step": 3, "weights and optimizer state": 11, "config optimizer": 5}
    assert disagreement([agree, dict(agree), dict(agree)]) is None
    late = dict(agree, step=2, **{"weights and optimizer state": 12})
    message = disagreement([agree, dict(agree), late, dict(agree, **{"config optimizer": 6})])
    assert message.startswith("rank 2 does not start where rank 0 does: it starts from micro-batch 2, rank 0 from 3; "
                              "its weights and optimizer state differ from rank 0's (1 more rank(s) differ too); "
                              "nothing was written.")
    assert "\n" not in message


def snapshot(folder):
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_ranks_that_resume_from_different_checkpoints_are_all_refused_and_nothing_is_written(cifar10, tmp_path):
    """A run directory per rank (as per machine, where rank 1's has no checkpoint of its own): after a whole run,
    rank 0's directory is cut back to step 3 and rank 1's to step 2. The resumed job must not train: both ranks
    stop with the line naming rank 1 and the steps, and neither directory changes.
    Mutation caught: without the check in train(), the job trained on (exit 0) and wrote records and checkpoints."""
    root, _ = cifar10
    runs = tmp_path / "runs"
    features = ["trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=20", "trainer.eval_interval=0"]

    def msrun(*extra):
        log_dir = tmp_path / f"logs-{len(list(tmp_path.glob('logs-*')))}"
        interpreter_dir = os.path.dirname(sys.executable)
        env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO),
               "PATH": interpreter_dir + os.pathsep + os.environ["PATH"]}
        command = [shutil.which("msrun", path=interpreter_dir), f"--worker_num={WORKERS}",
                   f"--local_worker_num={WORKERS}", f"--master_port={free_port()}", f"--log_dir={log_dir}",
                   "--join=True", "python", "-m", "trainkit", *tiny(root, *features, *extra),
                   f"hydra.run.dir={runs}/rank-${{oc.env:RANK_ID}}"]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return result, log_dir

    result, _ = msrun("trainer.epochs=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = runs / "rank-0", runs / "rank-1"
    assert not (rank1 / "checkpoints").exists()  # only rank 0 writes
    shutil.copytree(rank0 / "checkpoints", rank1 / "checkpoints")
    for folder, keep in ((rank0, 3), (rank1, 2)):
        for path in (folder / "checkpoints").glob("trainkit-*.ckpt"):
            if int(path.stem.rsplit("_", 1)[1]) > keep:
                path.unlink()
    before = {folder: snapshot(folder) for folder in (rank0, rank1)}

    result, log_dir = msrun("trainer.epochs=1", "trainer.resume=auto")
    assert result.returncode != 0
    line = ("trainkit: error: rank 1 does not start where rank 0 does: it starts from micro-batch 2, rank 0 from 3; "
            "its weights and optimizer state differ from rank 0's; nothing was written.")
    for rank in range(WORKERS):
        assert line in (log_dir / f"worker_{rank}.log").read_text(), rank
    assert {folder: snapshot(folder) for folder in (rank0, rank1)} == before
    assert STEPS_PER_EPOCH > 3


def built_wrapper():
    """wine_mlp's training cell as the app builds it, with Adam (two moments) and an EMA of the weights."""
    import mindspore as ms

    from trainkit.app import build

    cfg = compose_config(["recipe=wine_mlp", "run_dir=/unused", "wrapper.ema_decay=0.9", "+model.conv_impl=native"])
    data = build.instantiate_group("data", cfg.data)
    data.prepare()
    ms.set_seed(0)
    backbone = build.build_model(cfg, data)
    loss_network = build.build_loss_network_for(cfg, backbone, build.build_loss_fn(cfg))
    optimizer = build.build_optimizer(cfg, backbone, build.build_learning_rates(cfg, 0.01, 10, 1))
    return cfg, build.build_wrapper(cfg, loss_network, optimizer)


def test_the_optimizer_state_and_the_ema_are_in_what_ranks_compare(monkeypatch):
    """check_ranks_agree on the app's own training cell, the all-gather replaced by this rank's vector and a rank
    whose one value of one parameter differs: every weight, every optimizer state (Adam's moments, its step) and
    every EMA shadow must make the ranks disagree, and the value put back must make them agree again.

    Mutations caught: check_ranks_agree hashing ``wrapper.trainable_params()`` only (the weights), or start_signature
    skipping names under ``optimizer.``/``ema.`` (red: a rank with other moments or another EMA trains)."""
    import mindspore as ms

    from trainkit.distributed import agreement

    cfg, wrapper = built_wrapper()
    sent, peer = [], []  # what this rank sent; the other rank's vector (none: the same as this one's)

    def all_gather(vector):
        sent.append(vector)
        return np.concatenate([vector, peer[-1] if peer else vector])

    monkeypatch.setattr(agreement, "_all_gather", all_gather)
    agreement.check_ranks_agree(0, wrapper, cfg, 2)
    reference = sent[-1]
    parameters = dict(wrapper.parameters_and_names())
    kinds = {"weights": [n for n in parameters if n.startswith("layers.")],
             "Adam's moments": [n for n in parameters if n.startswith(("optimizer.moment1.", "optimizer.moment2."))],
             "the optimizer's step": [n for n in parameters if n == "optimizer.global_step"],
             "the EMA's shadows": [n for n in parameters if n.startswith("ema.ema.")]}
    assert all(kinds.values()), kinds  # the cell holds each kind: the test is not empty
    for kind, names in kinds.items():
        for name in names:
            parameter = parameters[name]
            kept = parameter.asnumpy().copy()
            changed = kept.copy().reshape(-1)
            changed[-1] += 1
            parameter.set_data(ms.Tensor(changed.reshape(kept.shape), parameter.dtype))
            agreement.check_ranks_agree(0, wrapper, cfg, 2)  # this rank with the changed value
            peer.append(sent[-1])
            parameter.set_data(ms.Tensor(kept, parameter.dtype))
            assert not np.array_equal(peer[-1], reference), (kind, name)
            with pytest.raises(agreement.RanksDisagree, match="rank 1 .*its weights and optimizer state differ"):
                agreement.check_ranks_agree(0, wrapper, cfg, 2)  # rank 1 has the changed value
            peer.clear()
            agreement.check_ranks_agree(0, wrapper, cfg, 2)
            assert np.array_equal(sent[-1], reference), (kind, name)  # put back: the ranks agree again
