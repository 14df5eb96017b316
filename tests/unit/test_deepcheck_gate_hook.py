"""The resume gate in remediation: a node back from hma's reboot waits for the gate
([deep_check] after_recovery) and is resumed once it lets go; the gate is not asked before."""

from __future__ import annotations

from pathlib import Path

from test_remediation_engine import FakeSlurm, fault, make, run, writes


def test_recovered_node_waits_for_the_gate(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    rem = make(tmp_path, fake)
    asked: list[str] = []
    hold = {"why": "deep check after recovery running: stress"}

    def gate(boot_id: str) -> str:
        asked.append(boot_id)
        return hold["why"]

    rem.resume_gate = gate
    try:
        run(rem, (fault(),))
        assert writes(fake) == ["DRAIN", "reboot"] and asked == []  # not before the reboot
        run(rem, (), boot="b2")  # back and healthy: the gate holds the resume
        assert writes(fake) == ["DRAIN", "reboot"] and asked and set(asked) == {"b2"}
        assert "DRAIN" in fake.state["n1"].flags
        hold["why"] = ""
        run(rem, (), boot="b2")
        assert writes(fake)[-1] == "RESUME" and "DRAIN" not in fake.state["n1"].flags
    finally:
        rem.close()
