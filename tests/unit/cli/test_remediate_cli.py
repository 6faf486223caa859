"""`ranksight remediate`: one sentence for a bad command line or a bad policy, before anything is read."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ranksight.cli import app


def test_one_scheduler_must_be_chosen(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("rules: {zombie_job: {action: cancel, min_firing_s: 0}}\n")
    for extra in ([], ["--slurm", "--kubernetes"]):
        result = CliRunner().invoke(app, ["remediate", "--policy", str(policy), *extra])
        assert result.exit_code == 1 and "--slurm or --kubernetes" in result.output


def test_a_bad_policy_is_one_sentence_naming_the_key(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("rules: {job_stall: {action: cancel, min_firing_s: 0}}\n")
    result = CliRunner().invoke(app, ["remediate", "--policy", str(policy), "--slurm"])
    assert result.exit_code == 1 and "rules.job_stall" in result.output and "Traceback" not in result.output
    missing = CliRunner().invoke(app, ["remediate", "--policy", str(tmp_path / "none.yaml"), "--slurm"])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_kubernetes_needs_the_namespaces_it_may_act_in(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("rules: {zombie_job: {action: cancel, min_firing_s: 0}}\n")
    result = CliRunner().invoke(app, ["remediate", "--policy", str(policy), "--kubernetes"])
    assert result.exit_code == 1 and "--kubernetes needs --namespace" in result.output


def test_a_policy_that_names_the_target_by_a_jobstarted_label_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules: {zombie_job: {action: cancel, min_firing_s: 0}}\nscheduler_job_label: ranksight.dev/scheduler-job-id\n"
    )
    result = CliRunner().invoke(app, ["remediate", "--policy", str(policy), "--slurm"])
    assert result.exit_code == 1 and "the target comes from the scheduler" in result.output
    assert "Traceback" not in result.output


def test_a_team_map_in_the_policy_is_read_relative_to_it(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules: {zombie_job: {action: cancel, min_firing_s: 0}}\nopt_in: {teams: [vision]}\nteam_map: none.yaml\n"
    )
    result = CliRunner().invoke(app, ["remediate", "--policy", str(policy), "--slurm"])
    assert result.exit_code == 1 and str(tmp_path / "none.yaml") in result.output, result.output
