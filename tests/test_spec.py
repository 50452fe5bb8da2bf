"""The run spec: one line per bad option (command line or TOML) before any model, the command line
overriding the file, and a finished run's ``spec.toml`` repeating its case set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import completed_cases, load_rows
from harness.spec import RunSpec, TrainSpec, load, to_toml


@pytest.fixture(scope="module")
def corrupt_corpora(tmp_path_factory):
    """Corpus directories with a truncated vocab.json and with a key missing."""
    root = tmp_path_factory.mktemp("corpora")
    out = {}
    for name, text in (("truncated", '{"chars": ["a", "b"], "n_tr'), ("missing_key", '{"chars": ["a", "b"]}')):
        d = root / name
        d.mkdir()
        for f in ("train.bin", "val.bin"):
            (d / f).write_bytes(b"\x00\x01" * 8)
        (d / "vocab.json").write_text(text)
        out[name] = d
    # a corpus whose tokens use ids its vocabulary does not have (prepared against another text)
    from workloads.data import prepare_corpus_from_text
    bad = prepare_corpus_from_text("abcabcabcabcabcabcabcabcabcabcabcabcabc" * 40, root / "badtok").path
    assert len(json.loads((bad / "vocab.json").read_text())["chars"]) == 3  # ids 0..2
    (bad / "train.bin").write_bytes(bytes([7] * (bad / "train.bin").stat().st_size))
    out["badtok"] = bad
    (root / "binary.toml").write_bytes(b"\xff\xfe[shape]\x00")
    out["binary"] = root / "binary.toml"
    return out


TOML_CASES = [
    # (command, toml text, needle in the one line)
    ("run", "[bogus]\nx = 1\n", "unknown key 'bogus'"),
    ("run", "[shape]\nwidthz = [64]\n", "unknown key shape.widthz"),
    ("run", '[shape]\nwidths = "64"\n', "shape.widths in"),
    ("run", '[shape]\nwidths = [64, "x"]\n', "must be an integer, got 'x'"),
    ("run", '[routers]\nrouters = ["haares"]\n[routers.router_options.haares]\nn_blocks = "x"\n',
     "routers.router_options in"),
    ("run", '[routers]\nrouters = ["prenorm"]\n[routers.router_options.haares]\nn_blocks = 2\n',
     "does not select"),
    ("run", "[timing]\nrepeats = 0\n", "timing.repeats in"),
    ("run", '[timing]\npaired = "yes"\n', "must be true or false"),
    ("run", "[sweep]\ncase_timeout = 5\n", "sweep.case_timeout in"),
    ("run", 'command = "train"\n', "use `routerbench train"),
    ("run", "[shape\nwidths = [64]\n", "not valid TOML"),
    ("run", "command = 5\n", "command must be a string"),
    ("run", '[sweep]\nbackends = ["eager"]\nsmallest_backends = ["eager"]\n', "already runs on the whole grid"),
    ("train", "[training]\ntarget_loss = -1.0\n", "training.target_loss in"),
    ("profile", '[profile]\nrouter = "nope"\n', "profile.router in"),
    ("profile", '[profile]\nrouter = "prenorm"\n[output]\nreport = true\n', "unknown key output.report"),
]

CLI_CASES = [
    (["run", "--routers", "prenorm,nope"], "--routers: 'nope' is not one of"),
    (["run", "--widths", "90", "--depths", "2"], "--widths 90 is not divisible by --n-heads 4"),
    (["run", "--n-heads", "3"], "is not divisible by --n-heads 3"),
    (["run", "--router-options", "{bad json"], "--router-options must be a JSON object"),
    (["run", "--router-options", '{"haares": {"n_blocks": 99}}'], "n_blocks=99 must be in 1..4"),
    (["run", "--router-options", '{"haares": {"n_blocks": "x"}}'], "haares.n_blocks must be an integer"),
    (["run", "--routers", "prenorm", "--router-options", '{"haares": {}}'], "which --routers does not select"),
    (["run", "--router-options", '{"nope": {}}'], "unknown router 'nope'"),
    (["run", "--router-options", '{"haares": {"bogus": 1}}'], "has no option(s) ['bogus']"),
    (["run", "--backends", "tpu"], "--backends: 'tpu' is not one of"),
    (["run", "--modes", "fwd,zzz"], "--modes: 'zzz' is not one of"),
    (["run", "--repeats", "0"], "--repeats must be >= 1"),
    (["run", "--repeats", "x"], "--repeats takes an integer, got 'x'"),
    (["run", "--warmup-s", "-1"], "--warmup-s must be >= 0"),
    (["run", "--no-paired", "--pair-order", "ABAB"], "--pair-order has no effect with --no-paired"),
    (["run", "--case-timeout", "5"], "--case-timeout needs --isolate"),
    (["run", "--backends", "compile", "--compile-modes", "reduce-overhead", "--compile-scope", "layer"],
     "--compile-modes reduce-overhead with --compile-scope layer"),
    (["run", "--no-train", "--train-steps", "5"], "--train-steps has no effect with --no-train"),
    (["run", "--backends", "eager", "--compile-modes", "default"], "--compile-modes has no effect"),
    (["run", "--backends", "eager", "--smallest-modes", "fwd"], "--smallest-modes has no effect"),
    (["run", "--data", "/no/such/dir"], "--data: no such directory"),
    (["run", "--data", "@truncated"], "--data: corrupt corpus"),
    (["train", "--target-loss", "2", "--data", "@missing_key"], "--data: corrupt corpus"),
    (["run", "--device", "tpu"], "--device 'tpu'"),
    (["run", "--device", "cuda"], "--device cuda: no CUDA device is visible"),
    (["run", "--dtype", "float8"], "--dtype: 'float8' is not one of"),
    (["run", "--target-loss", "-1"], "--target-loss must be > 0"),
    (["run", "--impls", "fast"], "--impls: 'fast' is not one of"),
    (["run", "--widths", "64,64"], "--widths lists a value twice"),
    (["run", "--widths", "16,,32"], "--widths takes comma-separated values without empty ones"),
    (["run", "--backends", "compile", "--smallest-backends", "compile"], "already runs on the whole grid"),
    (["run", "--modes", "fwd", "--backends", "eager", "--grad-checkpoint"], "--grad-checkpoint has no effect"),
    (["run", "--run-id", "../escape"], "--run-id '../escape': a run id is one name"),
    (["run", "--run-id", "sub/dir"], "--run-id 'sub/dir'"),
    (["run", "--run-id", ""], "--run-id '': a run id is one name"),
    (["run", "--run-id", "a" * 300], "at most 120"),
    (["train", "--target-loss", "2", "--seq-len", "100000000000000000000"], "--seq-len must be <= 1.67772e+07"),
    (["run", "--widths", "1000000"], "--widths must be <= 65536"),
    (["run", "--config", "@binary"], "not valid TOML (not UTF-8 text)"),
    (["train", "--target-loss", "2", "--data", "@badtok"], "holds token id"),
    (["run", "--bogus-flag"], "No such option '--bogus-flag'"),
    (["run", "--config", "/no/such.toml"], "--config /no/such.toml: no such file"),
    (["run", "--out", "@file"], "--out"),
    (["run", "--out", "/proc/version/sub"], "--out"),
    (["train", "--target-from-pilot", "nope"], "--target-from-pilot: 'nope' is not one of"),
    (["train", "--seeds", "0"], "--seeds must be >= 1"),
    (["train", "--chunk", "0"], "--chunk must be >= 1"),
    (["train", "--pilot-fraction", "1.5"], "--pilot-fraction must be <= 1"),
    (["train", "--pilot-fraction", "0"], "--pilot-fraction must be > 0"),
    (["train", "--target-from-pilot", "prenorm", "--target-loss", "2"], "--target-from-pilot and --target-loss exclude"),
    (["train", "--target-loss", "2", "--pilot-fraction", "0.5"], "--pilot-fraction applies to a pilot target"),
    (["train", "--backend", "tpu"], "--backend: 'tpu' is not one of"),
    (["train", "--precision", "fp8"], "--precision: 'fp8' is not one of"),
    (["train", "--grad-accum", "3"], "--grad-accum 3 does not divide --batch-size 16"),
    (["train", "--dtype", "bfloat16"], "use --precision bf16-mixed"),
    (["train", "--schedule", "parallel"], "--schedule: 'parallel' is not one of"),
    (["train", "--eval-every", "1000", "--max-steps", "20"], "--eval-every 1000 is more than --max-steps 20"),
    (["train", "--target-loss", "9"], "--target-loss 9 is not below ln(vocab)"),
    (["train", "--batch-size", "65536", "--seq-len", "1024"], "one training run needs an estimated"),
    (["train", "--target-from-pilot", "block_attnres", "--routers", "prenorm",
      "--router-options", '{"block_attnres": {"n_blocks": 99}}'], "n_blocks=99 must be in 1..4"),
    (["train", "--target-loss", "-1"], "--target-loss must be > 0"),
    (["train", "--target-loss", "2", "--data", "/no/such/dir"], "--data: no such directory '/no/such/dir'"),
    (["train", "--target-loss", "2", "--workload", "router_only"], "training needs the decoder workload"),
    (["train", "--target-loss", "2", "--seeds", "0"], "--seeds must be >= 1"),
    (["train", "--target-loss", "2", "--routers", "nope"], "--routers: 'nope' is not one of"),
    (["run", "--routers", "prenorm,full_attnres", "--impls", "naive,lean"],
     "--impls: lean is offered by none of --routers (prenorm, full_attnres)"),
    (["profile"], "--router is required"),
    (["profile", "--router", "nope"], "--router: 'nope' is not one of"),
    (["profile", "--router", "haares", "--backend", "tpu"], "--backend: 'tpu' is not one of eager, compile"),
    (["profile", "--router", "haares", "--mode", "sideways"], "--mode: 'sideways' is not one of fwd,"),
    (["profile", "--router", "prenorm", "--impl", "two_phase"], "--impl 'two_phase': router prenorm offers"),
    (["profile", "--router", "haares", "--methods", "guess"], "--methods: 'guess' is not one of labels,"),
    (["profile", "--router", "haares", "--active", "0"], "--active must be >= 1"),
    (["profile", "--router", "haares", "--router-options", '{"n_blocks": 99}'], "n_blocks=99"),
    (["profile", "--router", "haares", "--impl", "two_phase", "--router-options", '{"impl": "naive"}'],
     "--impl two_phase contradicts impl='naive'"),
    (["profile", "--router", "prenorm", "--compile-mode", "default"], "--compile-mode has no effect"),
    (["profile", "--router", "haares", "--backend", "eager", "--pairs", "3"],
     "--pairs has no effect with --methods labels"),
    (["train", "--chunk", "5", "--schedule", "sequential"], "--chunk has no effect with --schedule sequential"),
    (["run", "--remeasure-s", "0", "--max-attempts", "5"], "--max-attempts has no effect with --remeasure-s 0"),
    (["profile", "--router", "prenorm", "--backend", "cudagraph"], "no CUDA device here"),
    (["profile", "--router", "prenorm", "--backend", "compile", "--methods", "labels"], "--methods labels"),
    (["profile", "--router", "prenorm", "--d-model", "30"], "--d-model 30 is not divisible by --n-heads"),
    (["data", "prepare", "--text", "/no/such.txt", "--out", "x"], "--text FILE: no such file"),
]


def _one_line_error(res, needle):
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("routerbench: error:") and needle in lines[0], lines[0]


@pytest.mark.parametrize("args,needle", CLI_CASES, ids=[" ".join(a)[:60] for a, _ in CLI_CASES])
def test_bad_option_is_one_line_naming_it(tmp_path, no_models, corrupt_corpora, args, needle):
    args = list(args)
    for i, a in enumerate(args):
        if a.startswith("@") and a[1:] in corrupt_corpora:
            args[i] = str(corrupt_corpora[a[1:]])
        elif a == "@file":
            (tmp_path / "a_file").write_text("x")
            args[i] = str(tmp_path / "a_file")
    if args[0] != "data" and "--out" not in args:
        args += ["--out", str(tmp_path)]
    _one_line_error(CliRunner().invoke(main, args), needle)
    assert not list(tmp_path.rglob("records.jsonl")) and not list(tmp_path.rglob("spec.toml"))


@pytest.mark.parametrize("command,text,needle", TOML_CASES, ids=[t[:40] for _, t, _ in TOML_CASES])
def test_bad_toml_is_one_line_naming_the_key(tmp_path, no_models, command, text, needle):
    cfg = tmp_path / "spec.toml"
    cfg.write_text(text)
    extra = ["--target-loss", "2"] if command == "train" and "target_loss" not in text else []
    res = CliRunner().invoke(main, [command, "--config", str(cfg), "--out", str(tmp_path)] + extra)
    _one_line_error(res, needle)
    if needle.endswith(" in"):
        assert str(cfg) in res.output  # an error of a TOML value names its key and file


def test_tables_have_enough_cases():
    assert len(CLI_CASES) + len(TOML_CASES) >= 25


def test_command_line_overrides_the_file(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('[shape]\nwidths = [16, 32]\ndepths = [2]\n[timing]\nrepeats = 7\n')
    spec, labels = load(RunSpec, {"repeats": "3"}, str(cfg))
    assert spec.timing.repeats == 3 and spec.shape.widths == (16, 32)
    assert labels("timing.repeats") == "--repeats"
    assert labels("shape.widths") == f"shape.widths in {cfg}"
    spec, _ = load(RunSpec, {}, str(cfg))
    assert spec.timing.repeats == 7


def test_resolved_spec_is_a_fixed_point():
    """Resolving, writing and reading back a spec changes nothing, so spec.toml repeats a run."""
    spec, labels = load(RunSpec, {"routers": "prenorm,haares", "widths": "16", "depths": "2,4",
                                  "router_options": json.dumps({"haares": {"n_blocks": 2}})}, None)
    r1 = spec.resolve(labels)
    text = to_toml(r1, RunSpec.NOT_IN_FILE)
    assert "out =" not in text and "run_id" not in text
    import tomllib
    doc = tomllib.loads(text)
    assert doc["routers"]["router_options"] == {"haares": {"n_blocks": 2}}
    assert doc["sweep"]["smallest_backends"] == ["compile"] and doc["sweep"]["smallest_modes"] == ["fwd_bwd"]
    p = Path(__file__).parent / "_tmp_fixed_point.toml"
    try:
        p.write_text(text)
        s2, l2 = load(RunSpec, {}, str(p))
        r2 = s2.resolve(l2)
    finally:
        p.unlink()
    assert r2 == r1
    assert [c.key for c in r2.cases()] == [c.key for c in r1.cases()]


def test_defaults_resolve_to_the_device_suite():
    spec, labels = load(RunSpec, {}, None)
    r = spec.resolve(labels)
    # seeds: the four routers of the seeds' question, two_phase where offered (prenorm: naive),
    # fwd_bwd at d=64 and 4, 8 layers, eager at both, compiled at 4 layers
    assert r.sweep.suite == "seeds" and r.routers.routers == ("prenorm", "block_attnres", "haares", "wav_v1")
    assert r.shape.widths == (64,) and r.shape.depths == (4, 8) and r.sweep.modes == ("fwd_bwd",)
    assert r.sweep.backends == ("eager",) and r.sweep.smallest_backends == ("compile",)
    cases = r.cases()
    assert sorted({(c.router, c.impl) for c in cases}) == [("block_attnres", "two_phase"), ("haares", "two_phase"),
                                                           ("prenorm", "naive"), ("wav_v1", "two_phase")]
    assert len(cases) == 4 * 2 + 4
    assert {(c.cfg.n_layers, c.backend) for c in cases} == {(4, "eager"), (8, "eager"), (4, "compile")}
    assert r.race_routers() == ["prenorm", "haares"]
    # full: every router on the device grid, as the default was before the seeds suite
    spec, labels = load(RunSpec, {"suite": "full"}, None)
    r = spec.resolve(labels)
    assert r.shape.widths == (64, 128) and r.shape.depths == (4, 8)
    assert r.sweep.backends == ("eager",) and r.sweep.smallest_backends == ("compile",)
    # 11 routers + two_phase of the 3 block routers = 14 impls; eager on 2×2 shapes × 2 modes,
    # compile fwd_bwd at the smallest shape.
    assert len(r.cases()) == 14 * 4 * 2 + 14
    spec, labels = load(RunSpec, {"suite": "baselines"}, None)
    r = spec.resolve(labels)
    assert "haares" not in r.routers.routers and r.race_routers() == ["prenorm", "rezero"]
    t = TrainSpec().resolve(load(TrainSpec, {}, None)[1]).training
    # No target given: a prenorm pilot sets it at half the budget; 3 seeds; the default cadence is
    # at most 2.5 % of the step budget; interleaved where the runs fit.
    assert (t.target_loss, t.target_from_pilot, t.pilot_fraction, t.seeds) == (None, "prenorm", 0.5, 3)
    assert t.eval_every == 7 <= 0.025 * t.max_steps and t.chunk == 7
    assert (t.schedule, t.backend, t.precision, t.grad_accum) == ("auto", "eager", "fp32", 1)


def test_a_finished_runs_spec_repeats_its_case_set(tmp_path):
    args = ["run", "--routers", "prenorm,haares", "--widths", "16", "--depths", "2", "--modes", "fwd",
            "--repeats", "2", "--max-attempts", "1", "--warmup-s", "0", "--backends", "eager", "--impls", "naive,two_phase",
            "--no-train", "--no-report", "--no-flops", "--quiet", "--out", str(tmp_path), "--run-id", "first"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    first = next(tmp_path.glob("*/first"))
    res = CliRunner().invoke(main, ["run", "--config", str(first / "spec.toml"), "--out", str(tmp_path),
                                    "--run-id", "again"])
    assert res.exit_code == 0, res.output
    again = first.parent / "again"
    assert set(completed_cases(again)) == set(completed_cases(first)) and len(completed_cases(first)) == 3
    st = [(r["case_key"], r["repeat"]) for r in load_rows([again]) if r["metric"] == "step_time"]
    assert sorted(st) == sorted((r["case_key"], r["repeat"]) for r in load_rows([first])
                                if r["metric"] == "step_time")
    assert (again / "spec.toml").read_text() == (first / "spec.toml").read_text()
    # resuming with other options is refused, naming the first difference
    other = args[:args.index("--repeats") + 1] + ["3"] + args[args.index("--repeats") + 2:]
    _one_line_error(CliRunner().invoke(main, other), "started with timing.repeats = 2, not 3")
    no_train = [a for a in args if a != "--no-train"]
    _one_line_error(CliRunner().invoke(main, no_train), "race.train = false, not true")
    # a spec.toml written before an option existed resumes: the missing key takes its default
    spec = first / "spec.toml"
    text = spec.read_text()
    assert "supervise = false" in text
    spec.write_text(text.replace("supervise = false\n", ""))
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    # and a supervised resume checks the options given, not the run's own spec.toml (its child
    # process prints the line)
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "harness.cli", *args, "--supervise"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("routerbench: error:") and "sweep.supervise = false, not true" in lines[0]


def test_the_fallback_writer_gives_the_same_document():
    """Without tomli_w (a bare GPU box) spec.toml is written by a small writer: same document."""
    import tomllib

    from harness.spec.base import _dumps_subset
    spec, labels = load(RunSpec, {"routers": "prenorm,haares", "widths": "16", "depths": "2",
                                  "router_options": json.dumps({"haares": {"n_blocks": 2, "impl": "naive",
                                                                           "max_detail_scale": 2.5}})}, None)
    text = to_toml(spec.resolve(labels), RunSpec.NOT_IN_FILE)
    doc = tomllib.loads(text)
    assert tomllib.loads(_dumps_subset(doc)) == doc


def test_a_run_dir_is_resumed_only_by_its_own_command_and_readable_spec(tmp_path, no_models):
    base = ["--out", str(tmp_path), "--device", "cpu"]
    from harness.rundir.environment import device_slug
    d = tmp_path / device_slug("cpu") / "r1"
    d.mkdir(parents=True)
    (d / "spec.toml").write_text('command = "train"\n[training]\ntarget_loss = 2.0\n')
    res = CliRunner().invoke(main, ["run", "--run-id", "r1", "--no-train"] + base)
    _one_line_error(res, "holds a `routerbench train` run; choose another --run-id")
    (d / "spec.toml").unlink()
    (d / "records.jsonl").write_text("")
    _one_line_error(CliRunner().invoke(main, ["train", "--target-loss", "2", "--run-id", "r1"] + base),
                    "holds records but no spec.toml")
    (d / "spec.toml").write_text('command = "run"\n[shape\n')
    _one_line_error(CliRunner().invoke(main, ["run", "--run-id", "r1", "--no-train"] + base),
                    "spec.toml is unreadable")
    assert (d / "spec.toml").read_text() == 'command = "run"\n[shape\n'  # never overwritten


def test_shapes_are_checked_with_the_width_they_run_at():
    spec, labels = load(RunSpec, {"widths": "48", "depths": "2", "n_heads": "3", "train": False}, None)
    r = spec.resolve(labels)
    assert r.shape.n_heads == 3 and {c.cfg.head_dim for c in r.cases()} == {16}
    spec, labels = load(TrainSpec, {"target_loss": "2", "d_model": "48", "n_heads": "3"}, None)
    assert spec.resolve(labels).decoder_config().head_dim == 16
    # a named preset is its own shape
    spec, labels = load(RunSpec, {"preset": "char-12L", "train": False}, None)
    r = spec.resolve(labels)
    assert r.shape.widths == (512,) and r.shape.depths == (12,) and r.shape.n_heads == 8


def test_saved_specs_replay_from_anywhere(tmp_path, monkeypatch):
    """Paths are written absolute, and a CPU profile's spec holds no snapshot options."""
    from harness.spec import ProfileSpec
    from workloads.data import prepare_corpus_from_text
    prepare_corpus_from_text("the quick brown fox jumps over the lazy dog. " * 200, tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    spec, labels = load(TrainSpec, {"target_loss": "2", "data": "corpus"}, None)
    text = to_toml(spec.resolve(labels), TrainSpec.NOT_IN_FILE)
    assert f'data = "{tmp_path / "corpus"}"' in text
    spec, labels = load(ProfileSpec, {"router": "haares", "memory_snapshot": True}, None)
    r = spec.resolve(labels)
    assert r.profile.memory_snapshot is False and r.profile.max_entries is None
    p = tmp_path / "profile.toml"
    p.write_text(to_toml(r, ProfileSpec.NOT_IN_FILE))
    s2, l2 = load(ProfileSpec, {}, str(p))
    assert s2.resolve(l2) == r


def test_default_run_ids_differ_between_processes():
    import os

    from harness.rundir.environment import new_run_id
    rid = new_run_id()
    assert rid.endswith(f"-{os.getpid()}") and len(rid.split("-")) == 3


def test_report_errors_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(CliRunner().invoke(main, ["report", str(empty)]), "no records.jsonl in or below")
    _one_line_error(CliRunner().invoke(main, ["summary", str(tmp_path / "nope")]), "does not exist")
    (tmp_path / "file.txt").write_text("x")
    _one_line_error(CliRunner().invoke(main, ["summary", str(tmp_path / "file.txt")]), "is not a directory")
    from harness.rundir.writer import RunWriter
    from harness.sweep.cases import expand
    from workloads.config import PRESETS
    case = expand(["prenorm"], PRESETS["cpu-quick"], [16], [2], modes=["fwd"])[0]
    for rid in ("a", "b"):
        with RunWriter(tmp_path / "dev" / rid, rid, "s") as w, w.unit([case.key]) as u:
            for i in range(3):
                u.write(**case.columns(), metric="step_time", value=1.0 + i, unit="ms", repeat=i)
    _one_line_error(CliRunner().invoke(main, ["report", str(tmp_path / "dev")]), "2 runs given")
    _one_line_error(CliRunner().invoke(main, ["report", str(tmp_path / "dev"), "--out", "/proc/version/x"]),
                    "--out /proc/version/x: cannot write the report there")
    res = CliRunner().invoke(main, ["report", str(tmp_path / "dev"), "--out", str(tmp_path / "joint")])
    assert res.exit_code == 0 and (tmp_path / "joint" / "report.md").exists(), res.output


def test_a_relative_corpus_path_in_a_config_file_is_relative_to_that_file(tmp_path, monkeypatch):
    from workloads.data import prepare_corpus_from_text
    prepare_corpus_from_text("a small corpus of real words, repeated. " * 200, tmp_path / "cfg" / "corpus")
    (tmp_path / "cfg" / "train.toml").write_text('[training]\ntarget_loss = 2.0\ndata = "corpus"\n')
    monkeypatch.chdir("/")
    spec, labels = load(TrainSpec, {}, str(tmp_path / "cfg" / "train.toml"))
    assert spec.resolve(labels).training.data == str(tmp_path / "cfg" / "corpus")


def test_train_takes_the_presets_training_settings_where_options_are_unset():
    from workloads.config import TRAINING_PRESETS
    tp = TRAINING_PRESETS["haares-201m"]
    spec, labels = load(TrainSpec, {"preset": "haares-201m", "target_loss": 3.0}, None)
    r = spec.resolve(labels)
    tc = r.train_config()
    assert (r.shape.batch_size, r.training.grad_accum) == (tp.global_batch.value, tp.grad_accum)
    assert (tc.lr, tc.warmup_steps, tc.max_steps) == (tp.lr.value, tp.warmup_steps.value, tp.max_steps.value)
    spec, labels = load(TrainSpec, {"preset": "haares-201m", "target_loss": 3.0, "lr": 0.01, "batch_size": 16,
                                    "warmup_steps": 5}, None)
    r = spec.resolve(labels)
    assert (r.shape.batch_size, r.training.grad_accum, r.training.lr, r.train_config().warmup_steps) == (16, 1, 0.01, 5)
