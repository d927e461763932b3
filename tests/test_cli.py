import json

from typer.testing import CliRunner

from pearl.cli import app


def test_demo_runs_and_both_paths_agree():
    result = CliRunner().invoke(app, ["demo", "--sessions", "2", "--turns", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["turns_total"] == 4
    assert report["turns_identical"] == 4
    assert report["generated_tokens"] > 0 and report["kv_bytes_moved"] > 0
    assert report["prefix_cache_hit_rate"] > 0.3  # turn 2 reuses turn 1's KV


def test_demo_rejects_bad_options_with_a_clear_message():
    result = CliRunner().invoke(app, ["demo", "--sessions", "0"])
    assert result.exit_code != 0
    assert "sessions" in result.output
