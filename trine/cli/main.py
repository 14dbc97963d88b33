"""``trine`` command line. Heavy modules are imported inside the commands so ``--help`` is instant."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Trine: reinforcement fine-tuning of language models (explorer → buffer → trainer).",
)


def _buffer_commands() -> typer.Typer:
    from trine.cli.buffer import buffer_app

    return buffer_app


def _studio_command() -> Callable[..., None]:
    from trine.cli.studio import studio

    return studio


def _annotate_commands() -> typer.Typer:
    from trine.cli.annotate import annotate_app

    return annotate_app


def _tasks_commands() -> typer.Typer:
    from trine.cli.tasks import tasks_app

    return tasks_app


PLUGIN_HELP = "Python file(s) to load first; their @trine.register(...) plugins become valid names."


def _load(config: Path, overrides: list[str], plugins: list[Path], preflight: bool = True) -> list[Any]:
    """Load plugins, the config and its stages, and (``preflight``) check their data and model files
    (nothing is written); print every problem and exit 2 if there is any."""
    from trine.config import ConfigError, load_config
    from trine.inspect.preflight import check
    from trine.registry import load_plugin

    try:
        for plugin in plugins:
            load_plugin(plugin)
        stages = load_config(config, overrides)
        if preflight:
            check(stages)
    except (ConfigError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    return stages


@app.command()
def validate(
    config: Path = typer.Argument(..., help="YAML config file."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Check a config, its tasksets and model files, and report every error at once."""
    stages = _load(config, overrides or [], plugin)
    names = ", ".join(s.stage for s in stages)
    typer.secho(f"{config}: OK ({len(stages)} stage(s): {names})", fg=typer.colors.GREEN)


@app.command()
def check(
    config: Path = typer.Argument(..., help="YAML config file."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    turns: int = typer.Option(3, "--turns", min=1, help="Model turns of each sampled conversation."),
    seed: int = typer.Option(None, "--seed", help="Sampling seed (default: the config's seed)."),
    max_tokens: int = typer.Option(48, "--max-tokens", min=1, help="Most tokens sampled per turn."),
    episodes: int = typer.Option(
        2, "--episodes", min=0, help="Real episodes of the configured workflow to play and show (0: none)."
    ),
    tolerance: float = typer.Option(
        None, "--tolerance", help="Largest |engine - trainer| logprob (default: fp32 1e-3, bf16 0.25)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Check the config's model before a long run: chat template round trip, multi-turn token fidelity,
    action-mask alignment, rollout-engine vs trainer logprobs (plain, top-p, top-k); a few real episodes of
    the configured workflow shown with their trained and masked tokens, per-turn logprob agreement and
    reward parts; reward probes (padded, repeated, truncated, junk-appended, empty answers). Exit code: 0
    no check failed, 1 a check failed (--strict: or warned), 2 a bad config."""
    import json

    from trine.inspect.check import estimate, print_report, run_checks

    stages = _load(config, overrides or [], plugin)
    typer.echo(estimate(stages[0], turns, max_tokens, episodes), err=True)  # before torch and the model load
    try:
        report = run_checks(
            stages[0],
            turns=turns,
            seed=seed,
            max_tokens=max_tokens,
            tolerance=tolerance,
            config=str(config),
            episodes=episodes,
        )
    except ValueError as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=1))
    else:
        print_report(report)
    raise typer.Exit(report.exit_code(strict))


@app.command()
def plan(
    config: Path = typer.Argument(..., help="YAML config file."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    steps: int = typer.Option(3, "--steps", min=1, help="Steps measured per stage after the warm-up."),
    warmup: int = typer.Option(
        None, "--warmup", min=0, help="Warm-up steps per stage (default 1; async: 1 + max_staleness, ≤ 5)."
    ),
    min_seconds: float = typer.Option(
        3.0, "--min-seconds", min=0, help="Keep measuring a stage's steps until this many seconds."
    ),
    eval_tasks: int = typer.Option(
        0, "--eval-tasks", min=0, help="Evaluate this many tasks per eval taskset, scaled up (0: all)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Before a long run: measure a few real steps of every stage (sampling, reward, training, weight sync,
    evaluation, checkpoint; start-up and end) on this machine in a temporary directory, and print the
    expected seconds per step, tokens/s, peak memory and wall-clock per stage (per process with launch:
    processes), with the measured spread. Writes nothing into the run directory."""
    import json

    from trine.inspect.measure import Options, PlanError
    from trine.inspect.measure import plan as measure

    stages = _load(config, overrides or [], plugin)
    options = Options(steps=steps, warmup=warmup, min_seconds=min_seconds, eval_tasks=eval_tasks)
    say = lambda m: typer.echo(m, err=True)  # noqa: E731 - progress on stderr, the plan on stdout

    def measured() -> Any:
        try:
            return measure(stages, str(config), options, say, plugin)
        except PlanError as err:  # a config it cannot measure, or processes that failed: exit 2
            typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
            return 2

    estimate = _guarded(measured)
    if as_json:
        typer.echo(json.dumps(estimate.as_dict(), indent=1))
    else:
        from trine.inspect.estimate import report_lines

        typer.echo("\n".join(report_lines(estimate)))


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML config file."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Run a config: every stage in order, resuming from the run directory's last checkpoint."""
    stages = _load(config, overrides or [], plugin)
    launcher = stages[0].plan.launcher
    if launcher == "ray":
        _guarded(lambda: _on_cluster(lambda: _ray_launch(stages, plugin)))
        return
    if launcher == "processes":
        from trine.launch.processes import launch

        _guarded(lambda: launch(config, overrides or [], plugin, stages[0]))
        return
    from trine.loop import run as run_stages

    print_summary(_guarded(lambda: run_stages(stages)))


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config file (mode: async, a SQL buffer)."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
    replay: Path = typer.Option(
        None, "--replay", help="A run directory: train again on the steps it trained (its SQL buffer)."
    ),
) -> None:
    """The trainer process of an async run: trains on what `trine explore` processes put in the buffer.
    With --replay RUN_DIR: trains CONFIG's model on the steps that run trained, in a new run directory."""
    stages = _load(config, overrides or [], plugin)
    if replay is not None:
        print_summary(_guarded(lambda: _replay(stages, replay)))
        return
    from trine.launch.processes import train as train_process

    print_summary(_guarded(lambda: _process_input(lambda: train_process(stages))))


@app.command()
def explore(
    config: Path = typer.Argument(..., help="YAML config file (mode: async, a SQL buffer)."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    explorer_id: int = typer.Option(0, "--explorer-id", help="This explorer's index (0-based)."),
    explorers: int = typer.Option(1, "--explorers", help="How many explorer processes share the tasks."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """An explorer process of an async run: explores its share of the tasks with the trainer's newest weights."""
    stages = _load(config, overrides or [], plugin)
    from trine.launch.processes import explore as explore_process

    why = _guarded(lambda: _process_input(lambda: explore_process(stages, explorer_id, explorers)))
    typer.echo(f"explorer {explorer_id}: done ({why})")


@app.command()
def serve(
    config: Path = typer.Argument(..., help="YAML config file (mode: async, a SQL buffer; section serve:)."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides."),
    host: str = typer.Option(None, "--host", help="Address to listen on (default: serve.host, 127.0.0.1)."),
    port: int = typer.Option(None, "--port", help="Port (default: serve.port; 0 picks a free one)."),
    server_id: int = typer.Option(0, "--server-id", help="This server's index when several serve one run."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """An OpenAI-compatible server in front of the rollout model: every call becomes experience in the
    run's buffer, rewards arrive by POST /v1/feedback, and `trine train` on the same config trains on them
    while the server picks up its new weights."""
    _need_extra("trine serve")
    stages = _load(config, overrides or [], plugin)
    from trine.launch.serve import serve as serve_mode

    why = _guarded(lambda: _process_input(lambda: serve_mode(stages, host=host, port=port, index=server_id)))
    typer.echo(f"server {server_id}: done ({why})")


def _need_extra(command: str) -> None:
    """Exit 2 naming the install command when ``command``'s extra is missing (before anything loads)."""
    from trine.config.extras import command_problem

    problem = command_problem(command)
    if problem:
        typer.secho(problem, fg=typer.colors.RED, err=True)
        raise typer.Exit(2)


def _ray_launch(stages: list[Any], plugins: list[Path]) -> int:
    from trine.distributed.launch import launch

    return launch(stages, plugins)


def _on_cluster(fn: Callable[[], Any]) -> Any:
    """A run the Ray cluster cannot take (no ray, resources it can never grant) exits 2 with why."""
    from trine.distributed.launch import ClusterError
    from trine.launch.processes import ProcessSetupError

    try:
        return fn()
    except (ClusterError, ProcessSetupError) as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _replay(stages: list[Any], source: Path) -> dict[str, Any]:
    """``trine train --replay``: a run that cannot be replayed exits 2 with the message."""
    from trine.launch.replay import ReplayError, replay

    try:
        return replay(stages, source)
    except ReplayError as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _process_input(fn: Callable[[], Any]) -> Any:
    """A process that cannot join the run (not mode async, a buffer that cannot be shared, other
    settings than the run's, a second trainer) exits 2 with the message."""
    from trine.launch.processes import ProcessSetupError

    try:
        return fn()
    except ProcessSetupError as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` as a command: SIGTERM ends it like Ctrl-C (exit 143 / 130, status ``stopped``), a
    failure exits 1, and threads left behind never keep the process alive."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from trine.blocking import exit_guard
    from trine.status import Terminated, clear_stop, on_stop_signal

    code = 1  # failed: the error propagates (traceback, status.json "failed")
    clear_stop()
    previous = {
        sig: signal.signal(sig, on_stop_signal)  # a scheduler's stop ends like Ctrl-C; neither is lost
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        result = fn()
        code = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except KeyboardInterrupt as err:  # status.json says "stopped"; run the command again to resume
        code = 143 if isinstance(err, Terminated) else 130
        how = "terminated (SIGTERM)" if code == 143 else "interrupted"
        typer.secho(f"{how}: stopped (run the same command again to resume)", err=True)
        raise typer.Exit(code) from None
    finally:  # threads a plugin or a hung call left behind must not keep the process alive
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        exit_guard(code)
    if code:
        raise typer.Exit(code)
    return result


@app.command("init-model")
def init_model(
    preset: str = typer.Argument(..., help="tiny-0.5m, tiny-1m, tiny-5m or tiny-30m."),
    out_dir: Path = typer.Argument(..., help="Directory to write the HF-format model into."),
    seed: int = typer.Option(0, help="Initialisation seed."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing directory."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Build a tiny Qwen2-architecture model and byte-level BPE tokenizer locally (a built-in preset, or
    one a --plugin file registers with @trine.register("model_preset", name))."""
    from trine.models import count_parameters, load_model
    from trine.models import init_model as build
    from trine.registry import load_plugin

    try:
        for file in plugin:
            load_plugin(file)
        path = build(preset, out_dir, seed=seed, overwrite=overwrite)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    params = count_parameters(load_model(path))
    typer.echo(f"wrote {preset} ({params / 1e6:.2f}M parameters) to {path}")


@app.command()
def plot(run_dir: Path = typer.Argument(..., help="A run directory holding metrics.jsonl.")) -> None:
    """Write PNG curves (reward, eval accuracy, loss, response length) into RUN_DIR/plots."""
    from trine.monitor.plot import plot_run

    try:
        paths = plot_run(run_dir)
    except FileNotFoundError as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    for path in paths:
        typer.echo(str(path))


@app.command()
def status(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
) -> None:
    """Say whether a run is running, stuck (its step has not advanced for monitor.stuck_after × its median
    step: for how long, and what each side waits for), dead (killed: pid gone or heartbeat stale), finished,
    stopped or failed, at which step; for a run with explorer processes, one line per process (step,
    weights version, lag), the buffer's depth and the published weights. Exit code: 0
    running/stuck/finished/stopped, 1 dead/failed (or an explorer dead while the trainer runs), 2 no run
    there."""
    import json

    from trine.inspect.report import run_status

    report = run_status(run_dir, details=as_json)
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=1))
    elif report.trainer.state == "absent" and not report.processes:
        typer.secho(report.trainer.why, fg=typer.colors.RED, err=True)
    else:
        typer.echo("\n".join(report.lines()))
    raise typer.Exit(report.exit_code)


@app.command()
def bench(
    config: Path = typer.Argument(..., help="The YAML config of the run."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides (e.g. eval.k=16)."),
    checkpoints: str = typer.Option("all", "--checkpoints", help="all, latest, or steps: 2,4,6."),
    run_dir: Path = typer.Option(None, "--run-dir", help="The run directory (default: the config's)."),
    force: bool = typer.Option(False, "--force", help="Evaluate again what bench.jsonl already has."),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Evaluate a run's checkpoints on its eval tasksets (also while it trains): print a table, append
    to RUN_DIR/bench.jsonl and draw RUN_DIR/plots/bench.png."""
    stages = _load(config, overrides or [], plugin, preflight=False)  # the weights are the checkpoints'
    from trine.launch.bench import BenchError, print_bench
    from trine.launch.bench import bench as bench_run

    try:
        result = bench_run(
            stages,
            checkpoints=checkpoints,
            run_dir=run_dir,
            force=force,
            say=lambda m: typer.echo(m, err=True),
        )
    except (BenchError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    print_bench(result)


def print_summary(summary: dict[str, Any]) -> None:
    """The table printed at the end of a run (:func:`trine.monitor.summary.print_summary`)."""
    from trine.monitor.summary import print_summary as table

    table(summary)


app.add_typer(_buffer_commands(), name="buffer")
app.add_typer(_tasks_commands(), name="tasks")
app.add_typer(_annotate_commands(), name="annotate")
app.command("studio")(_studio_command())


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
