"""``hma fleet`` over labels others wrote (issue 28): one node's label with a number out of range
or a character hma never writes is shown as unreadable; every other node is rendered as before,
in text and in ``--json``."""

from __future__ import annotations

import json
import time

import pytest
from test_slurm_hostile_text import Slurm, client, node

from hma.commands import fleet

pytestmark = pytest.mark.timeout(60)

NOW = time.time()
BAD = {
    "n-nan": "hma=unhealthy:GPU_XID_79:none,t=nan",
    "n-inf": "hma=unhealthy:GPU_XID_79:none,t=inf",
    "n-huge": "hma=unhealthy:GPU_XID_79:none,t=1e300",
    "n-digits": "hma=unhealthy:GPU_XID_79:none,t=" + "9" * 400,
    "n-dneg": "hma=unhealthy:GPU_XID_79:none,d=-1764410041.250",
    "n-dnan": "hma=unhealthy:GPU_XID_79:none,d=nan",
    "n-future": f"hma=unhealthy:GPU_XID_79:none,t={NOW + 86400 * 365:.0f}",
    "n-esc": "hma=unhealthy:GPU_XID_79:none,j=17\x1b[2J+18",
}
GOOD = f"hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t={NOW - 60:.0f},r=1,j=17+18"


def cluster() -> Slurm:
    nodes = [
        node(name, Reason="(null)", StateComplete="idle", Extra=text) for name, text in BAD.items()
    ]
    nodes.append(node("n-ok", Extra=GOOD, Reason="HMA: GPU_XID_79 gpu:0000:3b:00"))
    nodes.append(node("n-free", Reason="(null)", StateComplete="idle"))
    for item in nodes:
        if item["Reason"] == "(null)":
            item["Timestamp"] = "Unknown"
    return Slurm(nodes)


def test_every_node_is_rendered_and_a_bad_label_is_unreadable() -> None:
    doc = fleet.collect(client(cluster()), "extra", 10.0, None)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert set(rows) == set(BAD) | {"n-ok"}
    for name in BAD:
        assert rows[name]["label"] == "unreadable" and rows[name]["since"] is None, name
        assert rows[name]["jobs"] == [] and rows[name]["reboots"] == 0
    ok = rows["n-ok"]
    assert (ok["label"], ok["code"], ok["jobs"], ok["reboots"]) == (
        "unhealthy",
        "GPU_XID_79",
        ["17", "18"],
        1,
    )
    text = fleet.render_text(doc)
    assert all(name in text for name in rows) and "\x1b" not in text
    assert text.count("label unreadable") == len(BAD)
    as_json = json.dumps(doc, indent=2, allow_nan=False)  # what `hma fleet --json` prints
    assert {r["node"] for r in json.loads(as_json)["nodes"]} == set(rows)


def test_a_history_with_entries_in_the_future_counts_nothing() -> None:
    future = f"{NOW + 86400:.0f}"
    mirror = f"hmah={future}:GPU_XID_79,{future}:GPU_XID_79,{future}:X,{future}:Y,{future}:Z"
    slurm = Slurm(
        [node("n1", Reason="(null)", Timestamp="Unknown", StateComplete="idle", Extra=mirror)]
    )
    doc = fleet.collect(client(slurm), "extra", 10.0, None, max_remediations=3)
    assert doc["nodes"] == [] or doc["nodes"][0]["remediations"] == 0
    assert not any(r["repeat_offender"] for r in doc["nodes"])
