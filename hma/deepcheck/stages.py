"""The node stages of a deep check: each runs its tool under a timeout and judges the output.

A stage gives a ``StageResult``: ``pass``, ``warn``, ``fail`` (findings with ``DEEP_*`` codes),
``unknown`` (the tool could not run: not found, not executable, killed by a signal, no libfabric
provider, timed out; or it printed what cannot be read, nan or out-of-range readings, or did not do
the work asked: ``DEEP_STAGE_UNKNOWN``, never evidence of a fault, never a pass) or ``skipped``
(its tool or its devices are not here: never a pass, never a fault). Collection does the I/O;
the ``judge_*`` functions are pure.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from hma.adapters.command import CommandResult, CommandRunner
from hma.contracts.model import Finding, RunStatus, Severity
from hma.deepcheck import parse
from hma.detection.setup import Setup

PASS, WARN, FAIL, UNKNOWN, SKIPPED = "pass", "warn", "fail", "unknown", "skipped"
DCGM_TIMEOUTS = {1: 300.0, 2: 900.0, 3: 3600.0, 4: 7200.0}
DEFAULT_TIMEOUTS = {"accelerators": 180.0, "efa": 300.0, "neuron": 900.0, "connectivity": 1800.0}
# Probe codes that say a device is missing or miswired (the accelerators stage).
WIRING_CODES = frozenset(
    {
        "GPU_COUNT_MISMATCH",
        "GPU_LOST",
        "GPU_PCIE_WIDTH_DEGRADED",
        "GPU_PCIE_WIDTH_NARROW",
        "GPU_NVLINK_DOWN",
        "GPU_FABRIC_NOT_READY",
        "GPU_FABRIC_UNHEALTHY",
        "NEURON_DEVICE_COUNT",
        "NEURON_CORE_COUNT",
        "NEURON_TOPOLOGY",
    }
)
STRESSORS = ("cpu", "vm", "hdd")
STRESS_FAILED_RC = 2  # stress-ng: "one or more stressors failed" (verification included)
# Exit statuses of a tool that did not reach a verdict of its own (128+N: signal N via a shell).
NOT_RUN_RC = {126: "not executable", 127: "not found, or a shared library is missing"}
SHELL_SIGNALS = range(129, 144)  # 128 + SIGHUP .. SIGTERM
# fi_pingpong could not open its libfabric provider or library: the tool did not run.
PROVIDER_ERRORS = ("fi_getinfo", "error while loading shared libraries")


@dataclass
class StageResult:
    """The outcome of one stage."""

    stage: str
    verdict: str
    message: str
    findings: list[Finding] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    duration_s: float = 0.0

    @property
    def run_status(self) -> RunStatus:
        """A stage that judged all of its tool's output is a completed observation; others
        (an unknown part included) are not, so they raise what they found but clear nothing."""
        judged = not any(f.severity is Severity.UNKNOWN for f in self.findings)
        return RunStatus.RAN if self.verdict in (PASS, WARN, FAIL) and judged else RunStatus.FAILED

    def to_json(self) -> dict[str, Any]:
        """The stage in ``hma deep-check --json``."""
        return {
            "stage": self.stage,
            "verdict": self.verdict,
            "message": self.message,
            "duration_s": round(self.duration_s, 3),
            "findings": [f.to_json() for f in self.findings],
            "details": self.details,
        }


@dataclass
class StageContext:
    """What a stage needs: the ``[deep_check]`` options, the setup, a runner and its timeout."""

    setup: Setup
    options: Mapping[str, Any]
    runner: CommandRunner
    timeout: float
    instance_type: Optional[str] = None
    env: Optional[Mapping[str, str]] = None

    def installed(self, argv: Sequence[str]) -> bool:
        """True when the command can be found (on PATH or as a path)."""
        path = (self.env or os.environ).get("PATH")
        return shutil.which(argv[0], path=path) is not None

    def run(self, argv: Sequence[str], timeout: Optional[float] = None) -> CommandResult:
        """Run a command under the stage's timeout (or less)."""
        return self.runner.run(argv, timeout=timeout or self.timeout, env=self.env)


def verdict_of(findings: Sequence[Finding]) -> str:
    """fail (a critical finding), unknown, warn, else pass."""
    severities = {f.severity for f in findings}
    if Severity.CRITICAL in severities:
        return FAIL
    if Severity.UNKNOWN in severities:
        return UNKNOWN
    return WARN if Severity.WARNING in severities else PASS


def unknown(stage: str, why: str, result: Optional[CommandResult] = None) -> StageResult:
    """A stage that could not give a verdict (``DEEP_STAGE_UNKNOWN``)."""
    details: dict[str, Any] = {"stage": stage, "why": why}
    if result is not None:
        details.update(rc=result.rc, timed_out=result.timed_out, output=_tail(result))
    finding = Finding("DEEP_STAGE_UNKNOWN", "node", f"{stage}: {why}", details)
    return StageResult(stage, UNKNOWN, why, [finding], details)


def skipped(stage: str, why: str) -> StageResult:
    """A stage whose tool or devices are not here."""
    return StageResult(stage, SKIPPED, why)


def _tail(result: CommandResult, lines: int = 5) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return "\n".join(text[-lines:])[-600:]


def _tool_problem(result: CommandResult) -> Optional[str]:
    """Why a finished command's output cannot be judged (started? timed out? crashed? cut?),
    or None."""
    if result.error:
        return result.error
    if result.timed_out:
        return f"timed out after {result.duration_s:.0f} s"
    if result.rc in NOT_RUN_RC:
        return f"exited {result.rc}: {NOT_RUN_RC[result.rc]}"
    if result.rc is not None and (result.rc < 0 or result.rc in SHELL_SIGNALS):
        number = -result.rc if result.rc < 0 else result.rc - 128
        return f"killed by signal {number} ({_signal_name(number)})"
    return result.cut_message() or None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unnamed"


def finish(result: StageResult, findings: Sequence[Finding], message: str) -> StageResult:
    """Set findings, verdict and message of a judged stage. Findings leave severity to the
    catalogue, so the verdict is final only once ``run_stages`` has resolved them (operator
    overrides included) and judged again."""
    result.findings = list(findings)
    result.verdict = verdict_of(result.findings)
    result.message = message
    return result


# --- stress ----------------------------------------------------------------------------------


def stress_argv(opts: Mapping[str, Any], yaml_path: str) -> list[str]:
    """stress-ng: one CPU worker per CPU, one memory and one disk worker, verified, bounded."""
    return [
        *opts["stress_command"],
        "--cpu",
        "0",
        "--vm",
        "1",
        "--vm-bytes",
        str(opts["stress_memory"]),
        "--hdd",
        "1",
        "--hdd-bytes",
        str(opts["stress_disk_bytes"]),
        "--temp-path",
        str(opts["stress_dir"]),
        "--verify",
        "--timeout",
        f"{float(opts['stress_seconds']):g}s",
        "--metrics-brief",
        "--yaml",
        yaml_path,
    ]


def stress(ctx: StageContext) -> StageResult:
    """CPU, memory and disk under stress-ng with verification."""
    argv = list(ctx.options["stress_command"])
    if not ctx.installed(argv):
        return skipped("stress", f"{argv[0]} is not installed")
    with tempfile.TemporaryDirectory(prefix="hma-stress-") as tmp:
        yaml_path = os.path.join(tmp, "metrics.yaml")
        result = ctx.run(stress_argv(ctx.options, yaml_path))
        try:
            with open(yaml_path, encoding="utf-8", errors="replace") as fh:
                yaml_text = fh.read(1 << 20)
        except OSError:
            yaml_text = ""
    return judge_stress(result, yaml_text)


def judge_stress(result: CommandResult, yaml_text: str) -> StageResult:
    """stress-ng's exit status and metrics: 2 with ``fail:`` lines is a fault, other non-zero
    statuses (bad arguments, no resources, not implemented) and missing metrics are unknown."""
    problem = _tool_problem(result)
    if problem:
        return unknown("stress", problem, result)
    fails = [line.strip() for line in result.stderr.splitlines() if " fail: " in f" {line} "]
    if result.rc == STRESS_FAILED_RC:
        details = {"rc": result.rc, "failures": fails[:20] or [_tail(result)]}
        finding = Finding(
            "DEEP_STRESS_FAILED",
            "node",
            "stress-ng: a stressor failed or its verification did not" " match",
            details,
        )
        return finish(
            StageResult("stress", FAIL, "", details=details), [finding], "stressor failed"
        )
    if result.rc != 0:
        return unknown("stress", f"stress-ng exited {result.rc}", result)
    try:
        metrics = parse.stress_metrics(yaml_text)
    except ValueError as exc:
        return unknown("stress", str(exc), result)
    missing = [s for s in STRESSORS if s not in metrics]
    if missing:
        return unknown("stress", f"stress-ng did not report {', '.join(missing)}", result)
    idle = [s for s in STRESSORS if not _did_work(metrics[s])]
    if idle:
        return unknown("stress", f"stress-ng's {', '.join(idle)} did no work (bogo-ops)", result)
    details = {
        s: {k: metrics[s][k] for k in ("bogo-ops", "wall-clock-time") if k in metrics[s]}
        for s in STRESSORS
    }
    return finish(StageResult("stress", PASS, "", details=details), [], "cpu, vm, hdd verified")


def _did_work(metrics: Mapping[str, str]) -> bool:
    """A stressor's bogo-ops is a positive finite count."""
    try:
        parse.number(metrics.get("bogo-ops", ""), "bogo-ops", 1e18, positive=True)
    except ValueError:
        return False
    return True


# --- accelerators ----------------------------------------------------------------------------


def accelerators(ctx: StageContext) -> StageResult:
    """GPU and Neuron devices present and wired, judged by the gpu and neuron probes."""
    from hma.detection.runner import run_once

    names = [n for n in ("gpu", "neuron") if n in ctx.setup.probes]
    if not names:
        return skipped("accelerators", "neither the gpu nor the neuron probe is installed")
    return judge_accelerators(run_once(ctx.setup, names))


def judge_accelerators(runs: Sequence[Any]) -> StageResult:
    """Missing/miswired devices from the probes' findings; an unfinished probe run, or a wiring
    reading the probe could not judge yet (GPUs settling after boot), is unknown."""
    ran = [r for r in runs if r.status not in (RunStatus.UNSUPPORTED, RunStatus.DISABLED)]
    if not ran:
        return skipped("accelerators", "no GPU or Neuron devices on this node")
    findings, unfinished = [], []
    for run in ran:
        if run.status is not RunStatus.RAN:
            unfinished.append(f"{run.probe}: {run.status.value} {run.error}".strip())
        for f in run.findings:
            if f.code in WIRING_CODES and f.severity is Severity.UNKNOWN:
                unfinished.append(f"{run.probe}: {f.code}: {f.message}")  # e.g. still settling
            elif f.code in WIRING_CODES:
                findings.append(
                    Finding(
                        "DEEP_ACCEL_WIRING",
                        f.component,
                        f"{f.code}: {f.message}",
                        {"code": f.code, **dict(f.details)},
                    )
                )
    if unfinished and not findings:
        return unknown("accelerators", "; ".join(unfinished))
    details = {"probes": {r.probe: r.status.value for r in ran}}
    message = f"{len(findings)} wiring problem(s)" if findings else "devices present and wired"
    return finish(StageResult("accelerators", PASS, "", details=details), findings, message)


# --- DCGM ------------------------------------------------------------------------------------


def dcgm(ctx: StageContext) -> StageResult:
    """``dcgmi diag -r LEVEL -j``, judged by DCGM's own verdict per test and GPU."""
    argv = list(ctx.options["dcgmi_command"])
    if not ctx.installed(argv):
        return skipped("dcgm", f"{argv[0]} is not installed")
    level = int(ctx.options["dcgm_level"])
    return judge_dcgm(ctx.run([*argv, "diag", "-r", str(level), "-j"]), level)


def judge_dcgm(result: CommandResult, level: int) -> StageResult:
    """fail -> DEEP_DCGM_FAIL, warn -> DEEP_DCGM_WARN per GPU and test; skip is neither.

    dcgmi exits non-zero when a test fails, so the JSON decides; no JSON is unknown. So is a
    result that names no GPU, and a GPU (or the whole run) with every test skipped: untested is
    not a pass."""
    problem = _tool_problem(result)
    if problem:
        return unknown("dcgm", problem, result)
    try:
        results = parse.dcgm_results(result.stdout)
    except ValueError as exc:
        return unknown("dcgm", str(exc), result)
    findings, gaps = [], _dcgm_gaps(results)
    for item in results:
        code = {"fail": "DEEP_DCGM_FAIL", "warn": "DEEP_DCGM_WARN"}.get(item["verdict"])
        if code is None:
            continue
        for gpu in item["gpus"]:
            findings.append(
                Finding(
                    code,
                    f"gpu:{gpu}",
                    f"dcgmi diag level {level}: {item['test']} {item['verdict']}",
                    {
                        "category": item["category"],
                        "test": item["test"],
                        "messages": item["messages"],
                    },
                )
            )
    counts = {v: sum(1 for r in results if r["verdict"] == v) for v in parse.DCGM_VERDICTS.values()}
    details = {"level": level, "results": counts}
    message = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if gaps:
        why = "; ".join(gaps)
        findings += unknown("dcgm", why, result).findings
        message = f"{message}; {why}"
    return finish(StageResult("dcgm", PASS, "", details=details), findings, message)


def _dcgm_gaps(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """What leaves a DCGM run incomplete: results naming no GPU, GPUs never tested."""
    gaps = [
        f"{r['test']} {r['verdict']} names no GPU"
        for r in results
        if not r["gpus"] and r["verdict"] != "skip"
    ]
    tested = {g for r in results if r["verdict"] != "skip" for g in r["gpus"]}
    untested = sorted({g for r in results for g in r["gpus"]} - tested, key=int)
    if untested:
        gaps.append(f"every test skipped on GPU {', '.join(untested)}")
    elif not tested:
        gaps.append("no test ran")
    return gaps


# --- EFA loopback ----------------------------------------------------------------------------


def efa_endpoints(ctx: StageContext) -> dict[str, dict[str, str]]:
    """Adapters from ``[probes.efa_mesh] adapters``, else the infiniband class in sysfs."""
    table = ctx.setup.config.probe("efa_mesh")["adapters"]
    if table:
        return {name: dict(spec) for name, spec in table.items()}
    folder = os.path.join(ctx.setup.config.section("paths")["sysfs"], "class", "infiniband")
    try:
        return {name: {} for name in sorted(os.listdir(folder))}
    except OSError:
        return {}


def efa(ctx: StageContext) -> StageResult:
    """fi_pingpong from each adapter to itself (provider and adapters as ``[probes.efa_mesh]``)."""
    if "efa_mesh" not in ctx.setup.probes:
        return skipped("efa", "the efa_mesh probe (adapter configuration) is not installed")
    mesh = ctx.setup.config.probe("efa_mesh")
    if not ctx.installed(mesh["command"]):
        return skipped("efa", f"{mesh['command'][0]} is not installed")
    adapters = efa_endpoints(ctx)
    if not adapters:
        return skipped("efa", "no EFA adapters on this node")
    env = {**(ctx.env or os.environ), **dict(mesh["env"])}
    per_adapter = max(5.0, ctx.timeout / len(adapters))
    results: dict[str, Any] = {}
    for i, (name, spec) in enumerate(sorted(adapters.items())):
        results[name] = _loopback(
            ctx, mesh, env, name, spec, int(mesh["base_port"]) + i, per_adapter
        )
    return judge_efa(results, ctx.instance_type, ctx.options)


def _loopback(
    ctx: StageContext,
    mesh: Mapping[str, Any],
    env: Mapping[str, str],
    name: str,
    spec: Mapping[str, str],
    port: int,
    timeout: float,
) -> dict[str, Any]:
    """One adapter: server and client on the same adapter; the client retries until it listens."""
    base = [*mesh["command"], "-p", mesh["provider"], "-e", mesh["endpoint"]]
    base += ["-I", str(mesh["iterations"]), "-S", str(mesh["size"])]
    domain = spec.get("domain") or (
        mesh["domain_format"].format(adapter=name) if mesh["domain_format"] else None
    )
    if domain:
        base += ["-d", domain]
    prefix = [*mesh["netns_exec"], spec["netns"]] if spec.get("netns") else []
    address = spec.get("address") or mesh["server_address"]
    box: dict[str, CommandResult] = {}
    server = threading.Thread(
        target=lambda: box.update(
            s=ctx.runner.run([*prefix, *base, "-B", str(port)], timeout=timeout + 1, env=env)
        ),
        daemon=True,
    )
    started = time.monotonic()
    server.start()
    client: Optional[CommandResult] = None
    while time.monotonic() - started < timeout:
        remaining = timeout - (time.monotonic() - started)
        argv = [*prefix, *base, "-P", str(port), address]
        client = ctx.runner.run(argv, timeout=remaining, env=env)
        refused = "Connection refused" in client.stderr or client.rc == 255
        if refused and server.is_alive():
            time.sleep(0.1)
            continue
        break
    server.join(timeout + 2)
    return loopback_outcome(client)


def loopback_outcome(client: Optional[CommandResult]) -> dict[str, Any]:
    """One adapter's fi_pingpong client: ``ok`` with its readings, ``failed`` (it ran and the
    exchange did not complete), ``timeout``, or ``error``: it could not run (crashed, not found,
    no libfabric provider or library) or its readings are not readings (nan, out of range)."""
    if client is None or client.timed_out:
        return {"status": "timeout"}
    problem = _tool_problem(client)
    if not problem and client.rc != 0:
        text = f"{client.stdout}\n{client.stderr}"
        if any(marker in text for marker in PROVIDER_ERRORS):
            problem = f"no libfabric provider or library: {_tail(client, 1)}"
    if problem:
        return {"status": "error", "rc": client.rc, "error": problem}
    if client.rc != 0:
        return {"status": "failed", "rc": client.rc, "error": _tail(client, 1)}
    try:
        return {"status": "ok", **parse.pingpong(client.stdout)}
    except ValueError as exc:
        return {"status": "error", "error": str(exc)}


def judge_efa(
    results: Mapping[str, Mapping[str, Any]], instance_type: Optional[str], opts: Mapping[str, Any]
) -> StageResult:
    """failed -> DEEP_EFA_LOOPBACK_FAILED; slower than this instance type's limits ->
    DEEP_EFA_LOOPBACK_SLOW; a timeout or unreadable output is unknown (the adapter may be fine)."""
    max_lat = dict(opts["efa_max_latency_us"]).get(instance_type or "")
    min_bw = dict(opts["efa_min_bandwidth_mbps"]).get(instance_type or "")
    findings = []
    for name, res in sorted(results.items()):
        comp = f"efa:{name}"
        if res["status"] == "failed":
            findings.append(
                Finding(
                    "DEEP_EFA_LOOPBACK_FAILED", comp, f"loopback failed: {res['error']}", dict(res)
                )
            )
        elif res["status"] != "ok":
            findings.append(
                Finding(
                    "DEEP_STAGE_UNKNOWN",
                    comp,
                    f"efa: {name} loopback {res['status']} {res.get('error', '')}".rstrip(),
                    dict(res),
                )
            )
        elif (max_lat and res["latency_us"] > max_lat) or (
            min_bw and res["bandwidth_mbps"] < min_bw
        ):
            limits = {"max_latency_us": max_lat, "min_bandwidth_mbps": min_bw}
            findings.append(
                Finding(
                    "DEEP_EFA_LOOPBACK_SLOW",
                    comp,
                    f"loopback {res['latency_us']:g} us, {res['bandwidth_mbps']:g} MB/s",
                    {**res, **limits, "instance_type": instance_type},
                )
            )
    message = f"{sum(r['status'] == 'ok' for r in results.values())}/{len(results)} adapters ok"
    result = StageResult("efa", PASS, "", details={"adapters": dict(results)})
    return finish(result, findings, message)


# --- Neuron ----------------------------------------------------------------------------------


def neuron(ctx: StageContext) -> StageResult:
    """nccom-test local all-reduce and the Neuron hardware check, whichever is installed."""
    sysfs = ctx.setup.config.section("paths")["sysfs"]
    if not os.path.isdir(os.path.join(sysfs, "class", "neuron_device")):
        return skipped("neuron", "no Neuron devices on this node")
    nccom, hw = list(ctx.options["nccom_command"]), list(ctx.options["neuron_hw_check_command"])
    have = {"nccom": ctx.installed(nccom), "hw_check": ctx.installed(hw)}
    if not any(have.values()):
        return skipped("neuron", f"neither {nccom[0]} nor {hw[0]} is installed")
    nccom_res = ctx.run([*nccom, "-r", "2", "allr"]) if have["nccom"] else None
    hw_res = ctx.run(hw) if have["hw_check"] else None
    return judge_neuron(nccom_res, hw_res)


def judge_neuron(nccom: Optional[CommandResult], hw: Optional[CommandResult]) -> StageResult:
    """A failed collective or hardware check (non-zero exit, wrong results) is a fault."""
    findings: list[Finding] = []
    details: dict[str, Any] = {}
    for name, res, code in (
        ("nccom-test", nccom, "DEEP_NEURON_COLLECTIVE_FAILED"),
        ("hardware check", hw, "DEEP_NEURON_HW_CHECK_FAILED"),
    ):
        if res is None:
            details[name] = "not installed"
            continue
        problem = _tool_problem(res)
        if problem:
            findings += unknown("neuron", f"{name}: {problem}", res).findings
            continue
        if res.rc != 0:
            findings.append(
                Finding(code, "node", f"{name} exited {res.rc}", {"output": _tail(res)})
            )
            continue
        if name == "nccom-test":
            try:
                table = parse.busbw(res.stdout)
            except ValueError as exc:
                findings += unknown("neuron", f"{name}: {exc}", res).findings
                continue
            details[name] = table
            if table["wrong"]:
                findings.append(Finding(code, "node", "nccom-test reported wrong results", table))
        else:
            details[name] = "passed"
    result = StageResult("neuron", PASS, "", details=details)
    return finish(result, findings, f"{len(findings)} problem(s)" if findings else "passed")


NODE_STAGE_FUNCS: dict[str, Callable[[StageContext], StageResult]] = {
    "stress": stress,
    "accelerators": accelerators,
    "dcgm": dcgm,
    "efa": efa,
    "neuron": neuron,
}


def stage_timeout(stage: str, opts: Mapping[str, Any]) -> float:
    """``[deep_check] timeouts.STAGE``, else the stage's default."""
    configured = dict(opts["timeouts"]).get(stage)
    if configured:
        return float(configured)
    if stage == "stress":
        return float(opts["stress_seconds"]) + 60.0
    if stage == "dcgm":
        return DCGM_TIMEOUTS[int(opts["dcgm_level"])]
    return DEFAULT_TIMEOUTS[stage]
