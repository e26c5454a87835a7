"""A file's config is data, and nothing in it is ever evaluated (trainkit.rundir.stored_config).

Strings made of ``$ { } \\ :``, letters and resolver names are planted, by a seeded generator, at every key of a real
stored config (composed and saved as the app saves it), as keys, as list items and three lists deep, then read back
through every entry that reads a stored config: ``saved_config``, ``tool_config(["run=..."])``,
``read_training_checkpoint`` (a checkpoint written by ``save_training_checkpoint``) and ``trainkit.tools.evaluate``'s
``main`` (a checkpoint, and ``run=``). Meanwhile every ``hydra.utils.instantiate``, Hydra's ``_locate``, OmegaConf's
interpolation parser and every registered resolver is recorded. Mutations tried: lists let through in
``_refusals`` (the generator and the depth-3 list case go red); plain ``${a}`` references allowed again (the
generator, the concatenation payload and the plain-reference cases go red); keys left unchecked (the generator goes
red); the check made before the ``hydra.yaml`` substitution instead of after (the legacy case goes red).
"""
import copy
import os
import random
import re
import sys
from functools import partial

import pytest
import yaml
from mindspore import nn
from omegaconf import OmegaConf

from trainkit.app.config import compose_config
from trainkit.app.run import save_config
from trainkit.app.tool_config import saved_config, tool_config
from trainkit.errors import ConfigError
from trainkit.rundir.checkpoint_file import Position, read_training_checkpoint, save_training_checkpoint
from trainkit.rundir.stored_config import MAX_BYTES, read_stored_config
from trainkit.rundir.trust import shipped_targets
from trainkit.tools.evaluate import main as evaluate

PIECES = ["$", "{", "}", "\\", ":", "a", "b", "x", "zz_a", " ", ".", "oc.create", "oc.env", "oc.decode",
          "oc.select", "hydra", "now", "_target_", "HOME", "'", ",", "${", "\\${", "${zz_a}"]


def generated(rng):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 9)))


def named(path):
    """A key path as a message names it: dotted names, ``[3]`` for a list's item."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def locations(node, path=()):
    """Every place of `node` something can be planted: ("key", path of a mapping entry), ("list", path of a list)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield "key", (*path, key)
            yield from locations(value, (*path, key))
    elif isinstance(node, list):
        yield "list", path
        for index, value in enumerate(node):
            yield "key", (*path, index)
            yield from locations(value, (*path, index))


def at(node, path):
    for part in path:
        node = node[part]
    return node


def plant(base, location, text, mode):
    """A copy of `base` holding `text` at `location`; the path of the key a refusal must name."""
    container = copy.deepcopy(base)
    kind, path = location
    if kind == "list":
        at(container, path).append([0, [1, [text]]] if mode == "nested" else text)
        end = len(at(container, path)) - 1
        return container, (*path, end, 1, 1, 0) if mode == "nested" else (*path, end)
    parent, last = at(container, path[:-1]), path[-1]
    if mode == "key" and isinstance(parent, dict):
        parent[text] = parent.pop(last)
        return container, (*path[:-1], repr(text))  # a key holding ${ is quoted where named
    parent[last] = [0, [1, [text]]] if mode == "nested" else text
    return container, (*path, 1, 1, 0) if mode == "nested" else path


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The text the app saves for a default run (``.hydra/config.yaml``; a checkpoint stores the same)."""
    run_dir = tmp_path_factory.mktemp("app") / "run"
    return save_config(compose_config([f"run_dir={run_dir}"]), run_dir)


def write_run(folder, text):
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text(text, encoding="utf-8")
    return folder


def write_checkpoint(path, text):
    """A training checkpoint written as a run writes one, its stored config `text`."""
    save_training_checkpoint(nn.Dense(2, 2), path, Position(0, 1), skipped_steps=0, group_size=1,
                             config_text=text, durable=False)
    return path


class Recorder:
    """Every instantiate target, ``_locate``d name, parsed interpolation and resolver called, while installed."""

    def __init__(self, monkeypatch):
        import hydra._internal.utils
        import hydra.utils
        import omegaconf.grammar_parser
        from omegaconf.basecontainer import BaseContainer

        self.instantiated, self.located, self.parsed, self.resolved = [], [], [], []
        replacements = {hydra.utils.instantiate: self._recording(hydra.utils.instantiate, self.instantiated, True),
                        hydra._internal.utils._locate: self._recording(hydra._internal.utils._locate, self.located),
                        omegaconf.grammar_parser.parse: self._recording(omegaconf.grammar_parser.parse, self.parsed)}
        for module in list(sys.modules.values()):  # every name bound to them (from hydra.utils import instantiate)
            for name, value in list(getattr(module, "__dict__", {}).items()):
                if any(value is original for original in replacements):
                    monkeypatch.setattr(module, name, replacements[value])
        for name, resolver in list(BaseContainer._resolvers.items()):
            monkeypatch.setitem(BaseContainer._resolvers, name, self._recording(resolver, self.resolved, name=name))

    @staticmethod
    def _recording(function, calls, target=False, name=None):
        def recorded(*args, **kwargs):
            first = args[0] if args else None
            calls.append(name or (first.get("_target_") if target and hasattr(first, "get") else first))
            return function(*args, **kwargs)
        return recorded

    def untrusted(self):
        """What was called that a stored config may not make trainkit call: any resolver or parsed interpolation,
        any target outside trainkit's own."""
        return ([f"resolver {name}" for name in self.resolved] + [f"parsed {text!r}" for text in self.parsed]
                + [f"target {name}" for name in self.instantiated + self.located if name not in shipped_targets()])


def refused_naming(call, source, key):
    """`call()` raises one ConfigError line naming `source` and `key`; its message."""
    with pytest.raises(ConfigError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{source}: {key} "), message
    assert "nothing in it is ever evaluated" in message and "saves its configs resolved" in message
    return message


def test_generated_strings_anywhere_in_a_stored_config_are_refused_or_read_as_data(stored, tmp_path, capsys,
                                                                                    monkeypatch):
    """Two plants at each of the ~110 places (220 cases); a string holding ``${`` is refused by every entry,
    naming its key, any other read back as it was written, and nothing is parsed, resolved or instantiated."""
    rng = random.Random(0)
    base = yaml.safe_load(stored)
    places = list(locations(base))
    assert len(places) > 100 and sum(kind == "list" for kind, _ in places) >= 3
    recorder = Recorder(monkeypatch)
    refused = accepted = 0
    for case in range(2 * len(places)):  # every place twice, a different string (and often way) each time
        text = generated(rng)
        location = places[case % len(places)]
        mode = rng.choice(["value", "key", "nested"]) if location[0] == "key" else rng.choice(["value", "nested"])
        container, path = plant(base, location, text, mode)
        written = yaml.dump(container, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))  # as a planter would
        run_dir = write_run(tmp_path / f"run{case}", written)
        checkpoint = write_checkpoint(tmp_path / f"c{case}.ckpt", written)
        saved = str(run_dir / ".hydra" / "config.yaml")
        stored_in = f"the config stored in checkpoint {checkpoint}"
        if "${" in text:
            refused += 1
            key = named(path)
            refused_naming(partial(saved_config, run_dir, []), saved, key)
            refused_naming(partial(tool_config, [f"run={run_dir}"]), saved, key)
            refused_naming(partial(read_training_checkpoint, checkpoint), stored_in, key)
            if case % 6 == 0:  # the command itself, both ways it reads a stored config
                for arguments, source in (([str(checkpoint)], stored_in),
                                          ([str(checkpoint), f"run={run_dir}"], saved)):
                    capsys.readouterr()
                    assert evaluate([*arguments, "--output", str(tmp_path / "out.json")]) == 2
                    err = capsys.readouterr().err
                    assert err == f"trainkit: error: {source}: {key} " + err.split(f"{key} ", 1)[1]
                    assert err.count("\n") == 1 and not (tmp_path / "out.json").exists()
        else:
            accepted += 1
            assert OmegaConf.to_container(read_training_checkpoint(checkpoint).config) == container
            assert OmegaConf.to_container(read_stored_config(run_dir / ".hydra" / "config.yaml", saved)) == container
        assert recorder.untrusted() == [], (case, text)
    assert refused >= 70 and accepted >= 70, (refused, accepted)  # 98 and 122

    # the recorder sees what it must refuse: a parsed interpolation, a resolver, an instantiated target
    from hydra.utils import instantiate

    assert OmegaConf.create({"home": "${oc.env:HOME,/}"}).home
    instantiate({"_target_": "pathlib.Path", "_args_": ["."]})
    assert recorder.untrusted() == ["resolver oc.env", "parsed '${oc.env:HOME,/}'", "target pathlib.Path",
                                    "target pathlib.Path"]


def payload(victim):
    return "{oc.create:{_target_: pathlib.Path.write_text, _args_: [{_target_: pathlib.Path, _args_: ['" \
        + str(victim) + "']}, 'import os']}}"


@pytest.mark.parametrize("case", ["concatenated", "escaped in a list at depth 3"])
def test_the_reported_payloads_run_nothing_through_any_entry(stored, tmp_path, capsys, monkeypatch, case):
    """Issue 47: ``${zz_a}${zz_b}`` concatenated into a live ``${oc.create:...}``; and an escaped one three lists
    deep (``model.freeze[0][1][0]``)."""
    victim = tmp_path / "x.pth"
    config = yaml.safe_load(stored)
    if case == "concatenated":
        config.update(zz_a="$", zz_b=payload(victim))
        config["data"]["val_fraction"] = "${zz_a}${zz_b}"
        key = "data.val_fraction"
    else:
        config["model"]["freeze"] = [["stem", ["\\$" + payload(victim)]]]
        key = "model.freeze[0][1][0]"
    text = yaml.safe_dump(config)
    run_dir = write_run(tmp_path / "run", text)
    checkpoint = write_checkpoint(tmp_path / "c.ckpt", text)
    recorder = Recorder(monkeypatch)
    saved = str(run_dir / ".hydra" / "config.yaml")
    refused_naming(lambda: saved_config(run_dir, []), saved, key)
    refused_naming(lambda: tool_config([f"run={run_dir}"]), saved, key)
    refused_naming(lambda: read_training_checkpoint(checkpoint), f"the config stored in checkpoint {checkpoint}", key)
    assert evaluate([str(checkpoint)]) == 2 and evaluate([str(checkpoint), f"run={run_dir}"]) == 2
    assert capsys.readouterr().err.count(f": {key} holds") == 2
    assert recorder.untrusted() == [] and not victim.exists()


def test_a_legacy_run_directory_reads_its_recorded_hydra_values_as_text(stored, tmp_path, monkeypatch):
    """``${hydra:runtime.cwd}`` is replaced by the text ``.hydra/hydra.yaml`` recorded, then checked: a recorded
    value holding ``${`` is refused; a key the user overrides is theirs."""
    config = yaml.safe_load(stored)
    config["data"]["root"] = "${hydra:runtime.cwd}/digits"
    config["run_dir"] = "${hydra:runtime.output_dir}"
    run_dir = write_run(tmp_path / "run", yaml.safe_dump(config))
    hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
    hydra_yaml.write_text(yaml.safe_dump({"hydra": {"runtime": {"cwd": "/somewhere", "output_dir": "/elsewhere"},
                                                    "run": {"dir": "outputs/${now:%H}"}}}))
    recorder = Recorder(monkeypatch)
    cfg = saved_config(run_dir, [])
    assert cfg.data.root == "/somewhere" + "/digits" and cfg.run_dir == "/elsewhere"

    hydra_yaml.write_text(yaml.safe_dump({"hydra": {"runtime": {"cwd": "${oc.env:HOME}"}}}))
    refused_naming(lambda: saved_config(run_dir, []), str(run_dir / ".hydra" / "config.yaml"), "data.root")
    hydra_yaml.unlink()
    assert saved_config(run_dir, ["data.root=/given"]).run_dir == str(run_dir)  # unrecorded: where it was read
    refused_naming(lambda: saved_config(run_dir, []), str(run_dir / ".hydra" / "config.yaml"), "data.root")
    assert saved_config(run_dir, ["data.root=/given"]).data.root == "/given"  # the user's value, after the check
    assert recorder.untrusted() == []
    # the user's own interpolation is theirs to resolve
    assert saved_config(run_dir, ["data.root=/given", "model.width=${trainer.seed}"]).model.width == \
        config["trainer"]["seed"]


def test_a_stored_config_is_bounded_plain_yaml(tmp_path):
    """No alias (a few lines expand to billions of nodes), no Python tag, no FIFO or oversized file."""
    laughs = "a: &a [x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(20))
    with pytest.raises(ConfigError, match=r"^SRC uses a YAML alias"):
        read_stored_config(laughs, "SRC")
    with pytest.raises(ConfigError, match="^SRC is not valid YAML: could not determine a constructor"):
        read_stored_config("a: !!python/object/apply:os.system ['true']", "SRC")
    big = tmp_path / "big.yaml"
    big.write_text("a: '" + "x" * MAX_BYTES + "'\n")
    with pytest.raises(ConfigError, match="is larger than a config"):
        read_stored_config(big, "BIG")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: a blocking read would never return
    with pytest.raises(ConfigError, match="^FIFO is not a regular file"):
        read_stored_config(fifo, "FIFO")
    assert OmegaConf.to_container(read_stored_config("lr: 1e-3\nday: 2020-01-01\n", "SRC")) == {
        "lr": 0.001, "day": "2020-01-01"}  # as OmegaConf.load reads them


@pytest.mark.parametrize("value", ["${model.width}", "${hydra:runtime.cwd}/x", "a ${model.width} b",
                                   r"\${oc.create:{_target_: pathlib.Path}}", "${oc.env:HOME}", r"\\${model.width}",
                                   "${oc.create:{_target_: trainkit.parts.losses.CrossEntropy}}", "${model.${x}}"])
def test_every_interpolation_is_refused_a_plain_reference_too(value):
    with pytest.raises(ConfigError, match=re.escape(f"FILE: data.x holds {value!r}, an interpolation")):
        read_stored_config(yaml.safe_dump({"model": {"width": 3}, "data": {"x": value}}), "FILE")


def test_the_users_overrides_cannot_assemble_a_live_interpolation_from_the_files_text(stored, tmp_path, monkeypatch):
    """Plain ``$`` and ``{oc.env:HOME}`` in the file pass; an override concatenating them resolves to a live
    ``${oc.env:HOME}``, refused before anything reads it. Mutation tried: the check in resolve_saved removed (the
    resolver oc.env is called)."""
    config = yaml.safe_load(stored)
    config.update(zz_a="$", zz_b="{oc.env:HOME}")
    run_dir = write_run(tmp_path / "run", yaml.safe_dump(config))
    recorder = Recorder(monkeypatch)
    refused = r"config.yaml with the overrides resolved: model.conv_impl holds '\$\{oc.env"
    with pytest.raises(ConfigError, match=refused):
        assert saved_config(run_dir, ["model.conv_impl=${zz_a}${zz_b}"]).model.conv_impl  # what a tool reads next
    assert recorder.resolved == []


def test_an_override_next_to_run_names_a_key_of_the_file(stored, tmp_path):
    config = yaml.safe_load(stored)
    config["extra"] = [{"x": 1}, {"x": 2}]
    run_dir = write_run(tmp_path / "run", yaml.safe_dump(config))
    assert OmegaConf.to_container(saved_config(run_dir, ["extra.1.x=5"]).extra) == [{"x": 1}, {"x": 5}]
    for missing in ("extra.2.x=5", "extra.1.y=5", "model.nothing=1", "nothing.x=1"):
        with pytest.raises(ConfigError, match=f"^{missing.split('=')[0]} is not a key of "):
            saved_config(run_dir, [missing])


def test_the_old_names_warn_and_refuse_as_the_reader_does(tmp_path):
    from trainkit.app.tool_config import with_hydra_values
    from trainkit.rundir.trust import check_data_only

    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match=r"^F: a.b\[0\] holds '\$\{x\}'"):
        check_data_only({"a": {"b": ["${x}"]}}, "F")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: {cwd: /w}}\n")
    with pytest.warns(DeprecationWarning):
        assert with_hydra_values(OmegaConf.create({"p": "${hydra:runtime.cwd}/d"}), tmp_path).p == "/w/d"
