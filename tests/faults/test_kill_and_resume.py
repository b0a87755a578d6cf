"""A run killed at every publish point resumes to the artifacts of a run that was never killed.

Each chain kills an ``ac2 run --runner inprocess`` (a process forked from the warm
``zygote``) with SIGKILL at one publish, checks what the dead run left (every artifact a
reader finds is whole; the one being published is not there), starts the run again to be
killed at the next publish, and so on through the bootstrap and every iteration; the last
start finishes. Its run folder must then hold exactly the artifacts of an uninterrupted
run, byte for byte, and nothing else: every staging folder, renamed-aside copy and orphan
object the kills left was removed by a later start, which says so.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from ac2_core import storage
from ac2_core.runner.layout import RunLayout
from ac2_core.stages import recipe
from tests.conftest import tiny_config
from tests.faults.conftest import RUN_FILES, Killed, artifacts_of, config_yaml, local_files, stray_files
from tests.storage.conftest import s3_for

ALLOWED = RUN_FILES


def publish_schedule(cfg) -> list[int]:
    """For each publish of a run, which publish of the process that resumes before it to kill.

    A resumed run redoes the unfinished bootstrap or iteration from its start: the first kill
    of each iteration falls after the whole of the one before (killed at its last publish)."""
    where = RunLayout("x").output
    phases = [sum(len(c.outputs) for c in recipe.calls(cfg, it, where)) for it in range(cfg.run.iterations + 1)]
    schedule = []
    for p, count in enumerate(phases):
        schedule += [(phases[p - 1] if p and i == 1 else 0) + i for i in range(1, count + 1)]
    return schedule


def run_argv(config: str, out: str) -> list[str]:
    return ["run", "--config", config, "--out", out, "--runner", "inprocess"]


def kill_chain(zygote, argv: list[str], schedule: list[int], point: str, check, **kwargs) -> None:
    for step, nth in enumerate(schedule):
        with pytest.raises(Killed):
            zygote.ac2(argv, kill_at=point, nth=nth, **kwargs)
        check(step)
    assert zygote.ac2(argv, **kwargs) == 0


@pytest.fixture(scope="module")
def local_reference(zygote, tmp_path_factory):
    """An uninterrupted 2-iteration run (the checkpoint of iteration 1 pruned: keep_models 1, and
    keep_best off, as the tiny run's equal validation scores would keep iteration 1 as the best)."""
    folder = tmp_path_factory.mktemp("reference")
    cfg = tiny_config(run__keep_models=1, run__keep_best=False)
    out = str(folder / "run")
    assert zygote.ac2(run_argv(config_yaml(cfg, folder), out)) == 0
    return cfg, artifacts_of(out)


def test_the_staging_of_an_actor_whose_publish_was_killed_is_removed_by_the_resume(zygote, tmp_path, capfd):
    """As it was seen: ``ac2 run`` SIGKILLed while update_actor publishes the actor left
    ``iter-0001/update_actor/.actor.staging-*``, and the resume succeeded without removing it."""
    cfg = tiny_config(run__iterations=1)
    out = str(tmp_path / "run")
    where = RunLayout(out).output
    publishes = [uri for it in (0, 1) for call in recipe.calls(cfg, it, where) for uri in call.outputs.values()]
    actor = Path(where(1, "actor"))
    argv = run_argv(config_yaml(cfg, tmp_path), out)
    with pytest.raises(Killed):
        zygote.ac2(argv, kill_at="publish", nth=publishes.index(str(actor)) + 1)
    staged = [p for p in actor.parent.iterdir() if p.name.startswith(".actor.staging-")]
    assert len(staged) == 1 and not actor.exists()
    capfd.readouterr()
    assert zygote.ac2(argv) == 0
    assert list(actor.parent.iterdir()) == [actor]
    assert f"removed {staged[0]}: left by a run that was killed" in capfd.readouterr().out


@pytest.mark.slow
def test_a_local_run_killed_at_each_of_its_publishes_resumes_to_identical_artifacts(zygote, local_reference, tmp_path, capfd):
    cfg, expected = local_reference
    out = str(tmp_path / "run")
    schedule = publish_schedule(cfg)
    assert len(schedule) == 7 + 11 + 11  # every table and checkpoint of the bootstrap and both iterations
    left: list[str] = []

    def check(step: int) -> None:
        artifacts_of(out)  # whatever a reader finds now is whole and verifies
        debris = stray_files(out, local_files, ALLOWED + ("run.lock",))
        # the publish that was killed left its staging folder and nothing else (earlier ones were swept)
        folders = {re.sub(r"(\.staging-[^/]+)/.*$", r"\1", f) for f in debris}
        assert len(folders) == 1 and ".staging-" in next(iter(folders)), (step, debris)
        left.extend(folders)

    kill_chain(zygote, run_argv(config_yaml(cfg, tmp_path), out), schedule, "publish", check)
    assert artifacts_of(out) == expected
    assert stray_files(out, local_files, ALLOWED) == []
    assert not Path(out, "run.lock").exists()
    said = capfd.readouterr().out
    assert len(left) == len(schedule) and all(f"{Path(out, d)}: left by a run that was killed" in said for d in left)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["replaced", "published"])
def test_a_run_killed_inside_a_replacement_resumes_to_identical_artifacts(zygote, local_reference, tmp_path, point):
    """The bootstrap's publishes replace those of a killed bootstrap: killed between the two renames
    (nothing at the name for a moment) and after them (the old copy not yet deleted)."""
    cfg, expected = local_reference
    out = str(tmp_path / "run")
    argv = run_argv(config_yaml(cfg, tmp_path), out)
    with pytest.raises(Killed):  # leaves problems, actor and critic published, replay staged
        zygote.ac2(argv, kill_at="publish", nth=4)
    with pytest.raises(Killed):  # the second replacement: the actor's
        zygote.ac2(argv, kill_at=point, nth=2)
    aside = [f for f in local_files(out) if ".old-" in f]
    assert aside and all(f.startswith("bootstrap/.actor.old-") for f in aside)
    assert storage.exists(str(Path(out, "bootstrap", "actor"))) == (point == "published")
    assert zygote.ac2(argv) == 0
    assert artifacts_of(out) == expected
    assert stray_files(out, local_files, ALLOWED) == []


@pytest.mark.slow
def test_a_run_on_s3_killed_before_each_manifest_resumes_to_identical_artifacts(zygote, seaweed, clean_aws_env, tmp_path):
    """On an object store a publish that dies before its manifest leaves data objects and no manifest."""
    with s3_for(seaweed, clean_aws_env, "kill-chain") as s3:
        section = s3.section.model_dump()
        cfg = tiny_config(run__iterations=1, **{f"storage__{k}": v for k, v in section.items()})
        config = config_yaml(cfg, tmp_path)
        reference, out = s3.uri("reference"), s3.uri("run")
        temp = tmp_path / "tmp"
        temp.mkdir()
        kwargs = {"tempdir": str(temp)}
        assert zygote.ac2(run_argv(config, reference), **kwargs) == 0
        schedule = publish_schedule(cfg)
        assert len(schedule) == 7 + 11

        def check(step: int) -> None:
            artifacts_of(out)
            orphans = stray_files(out, s3.objects, RUN_FILES + ("run.lock",))
            assert orphans and not any(f.endswith(storage.MANIFEST) for f in orphans), (step, orphans)
            # the dead process's staging folder in the temp folder, named after it
            assert any(p.name.startswith(".") and ".staging-" in p.name for p in temp.iterdir()), step

        kill_chain(zygote, run_argv(config, out), schedule, "manifest", check, **kwargs)
        assert artifacts_of(out) == artifacts_of(reference)
        assert stray_files(out, s3.objects, RUN_FILES) == []
        # the sweep of each start left the TensorBoard event files alone (objects with no manifest, not leftovers)
        assert any(f.startswith("tensorboard/") for f in s3.objects(out))
        left_in_temp = [p for folder in (temp, temp / "ac2-models") if folder.exists() for p in folder.iterdir()]
        assert [p for p in left_in_temp if p.name.startswith(".")] == []


def test_a_kill_after_the_first_object_of_an_s3_publish_leaves_no_artifact_and_the_sweep_removes_it(
    zygote, seaweed, clean_aws_env, tmp_path
):
    """A checkpoint of several files killed after its first upload: no manifest, some objects; the next start removes them."""
    with s3_for(seaweed, clean_aws_env, "kill-upload") as s3:
        section = s3.section.model_dump()
        cfg = tiny_config(run__iterations=1, **{f"storage__{k}": v for k, v in section.items()})
        argv = run_argv(config_yaml(cfg, tmp_path), s3.uri("run"))
        with pytest.raises(Killed):  # the bootstrap actor: the first objects of the second artifact
            zygote.ac2(argv, kill_at="uploaded", nth=2, tempdir=tempfile.mkdtemp(dir=tmp_path))
        orphans = stray_files(s3.uri("run"), s3.objects, RUN_FILES + ("run.lock",))
        assert orphans and all(f.startswith("bootstrap/actor/") for f in orphans)
        with storage.using(s3.section):
            assert not storage.exists(s3.uri("run", "bootstrap", "actor"))
            removed = storage.remove_leftovers(s3.uri("run"))
        assert s3.uri("run", "bootstrap", "actor") in removed
        assert stray_files(s3.uri("run"), s3.objects, RUN_FILES + ("run.lock",)) == []


@pytest.mark.slow
def test_a_run_killed_while_it_prunes_an_old_checkpoint_resumes_to_identical_artifacts(zygote, local_reference, tmp_path):
    """After iteration 2 the run drops iteration 1's checkpoints (keep_models 1); killed between the
    two, the rerun finds both iterations done, and finishes the pruning."""
    cfg, expected = local_reference
    out = str(tmp_path / "run")
    argv = run_argv(config_yaml(cfg, tmp_path), out)
    with pytest.raises(Killed):  # a fresh run renames nothing aside until it prunes: the actor of iteration 1
        zygote.ac2(argv, kill_at="replaced", nth=1)
    assert [f for f in local_files(out) if ".old-" in f][0].startswith("iter-0001/update_actor/.actor.old-")
    assert storage.exists(str(Path(out, "iter-0001", "update_critic", "critic")))
    assert zygote.ac2(argv) == 0
    assert artifacts_of(out) == expected
    assert stray_files(out, local_files, ALLOWED) == []
