"""`flywheel deployments`: dedicated deployments through the gateway's /v1/deployments.

``--url`` and ``--api-key`` (or ``OPENAI_API_KEY``) say where and as whom; the default is the
profile's gateway as its admin (the key in the run directory). A team's key needs the
``deployments`` scope to create, scale or delete.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Optional

import httpx
import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console

deployments_app = typer.Typer(no_args_is_help=True, help="Dedicated deployments: create, list, get, scale, delete.")
UrlOpt = typer.Option(None, "--url", help="the gateway's base URL (default: the profile's gateway)")
KeyOpt = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="a team key (default: the profile's admin key)")
WaitOpt = typer.Option(False, "--wait", help="show progress until the deployment is RUNNING (or gone, for delete)")
SETTLED = ("RUNNING", "FAILED", "STOPPED")
ReplicasOpt = typer.Option(None, min=1, help="a fixed count (default 1; or --min and --max to autoscale)")
MinOpt = typer.Option(None, "--min", min=0, help="autoscale: fewest replicas (0: scaled to zero when idle)")
MaxOpt = typer.Option(None, "--max", min=1, help="autoscale: most replicas")
TargetOpt = typer.Option(None, "--target-concurrency", help="autoscale: requests in flight per replica to aim at")
UpOpt = typer.Option(None, "--scale-up-window", help="autoscale: seconds demand stays above before a scale-up")
DownOpt = typer.Option(None, "--scale-down-delay", help="autoscale: seconds demand stays below before a scale-down")
ZeroOpt = typer.Option(None, "--scale-to-zero-after", help="autoscale, --min 0: seconds idle before the last replica stops")
ColdOpt = typer.Option(None, "--cold-start-timeout", help="autoscale, --min 0: seconds a request waits for a replica")
TtftOpt = typer.Option(None, "--ttft-p90-ms", help="autoscale: one more replica while the p90 time to first token is above it")


class Overflow(str, Enum):
    serverless = "serverless"


class Api:
    def __init__(self, profile: str, overrides, url: Optional[str], api_key: Optional[str]):
        if url is None or api_key is None:
            cfg = _config(profile, overrides)
            url, api_key = url or cfg.resolved_gateway().url, api_key or cfg.admin_key()
        self.http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"}, timeout=30)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            r = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            console.print(f"[red]cannot reach the gateway at {self.http.base_url}:[/] {exc} (is the stack up? `flywheel up`)")
            raise typer.Exit(1)
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:300]
            console.print(f"[red]{r.status_code}:[/] {message}")
            raise typer.Exit(1)
        return r.json()

    def follow(self, dep: dict, until_gone: bool = False) -> dict:
        """Print each change of status and ready replicas until the deployment settles."""
        last = None
        t0 = time.monotonic()
        while True:
            now = (dep["status"], dep["replicas"]["ready"], dep["replicas"]["desired"])
            if now != last:
                console.print(f"{time.monotonic() - t0:6.1f} s  {dep['id']}  {now[0]}  replicas {now[1]}/{now[2]}")
                last = now
            if (not until_gone and dep["status"] in SETTLED and now[1] == now[2]) or dep["status"] in ("FAILED", "STOPPED"):
                return dep
            time.sleep(0.5)
            r = self.http.get(f"/v1/deployments/{dep['id']}")
            if r.status_code == 404 and until_gone:
                console.print(f"{time.monotonic() - t0:6.1f} s  {dep['id']}  deleted")
                return dep
            dep = r.json()


def _show(dep: dict) -> None:
    console.print_json(data=dep)
    if dep.get("decisions"):
        table = Table("when", "replicas", "signal", "value", "target", "decision", title="autoscaling, newest last")
        for d in dep["decisions"]:
            when = time.strftime("%H:%M:%S", time.localtime(d["at"]))
            moved = f"{d['replicas_from']} -> {d['replicas_to']}"
            table.add_row(when, moved, d["signal"], str(d["value"]), str(d["target"]), d["reason"])
        console.print(table)


def replicas_body(replicas, low, high, target, up_s, down_s, zero_s, cold_s, ttft_ms=None) -> dict:
    """The create or scale body's ``replicas`` (and ``autoscale``) from the command line."""
    knobs = {
        "target_concurrency": target,
        "scale_up_window_s": up_s,
        "scale_down_delay_s": down_s,
        "scale_to_zero_after_s": zero_s,
        "cold_start_timeout_s": cold_s,
        "ttft_p90_ms": ttft_ms,
    }
    knobs = {k: v for k, v in knobs.items() if v is not None}
    if low is None and high is None:
        if knobs:
            raise typer.BadParameter("autoscaling knobs need --min and --max")
        return {"replicas": replicas or 1}
    if replicas is not None or low is None or high is None:
        raise typer.BadParameter("give --replicas N for a fixed count, or both --min and --max to autoscale")
    return {"replicas": {"min": low, "max": high}} | ({"autoscale": knobs} if knobs else {})


def create(api: Api, model: str, name: Optional[str], replicas: dict, team: Optional[str], wait: bool) -> dict:
    """``replicas``: the body's ``replicas`` (and ``autoscale``), as :func:`replicas_body` makes it,
    and ``overflow``."""
    body = {"model": model, **replicas} | ({"name": name} if name else {}) | ({"team": team} if team else {})
    dep = api.call("POST", "/v1/deployments", body)
    r = dep["replicas"]
    shown = f"{r['min']}-{r['max']} replicas, autoscaled" if r.get("max") else f"{r['desired']} replica(s)"
    console.print(f"{dep['id']}: {dep['served_model']} ({dep['checkpoint_version']}), {shown}, {dep['status']}")
    if wait:
        dep = api.follow(dep)
        if dep["status"] != "RUNNING":
            console.print(f"[red]{dep['status']}:[/] {dep.get('reason')}")
            raise typer.Exit(1)
        console.print(f"send model={dep['served_model']!r}")
    return dep


@deployments_app.command("create")
def deployments_create(
    model: str = typer.Argument(..., help="a registered checkpoint version, or a served base model"),
    name: Optional[str] = typer.Option(None, help="served as <team>/<name> (default: the version)"),
    replicas: Optional[int] = ReplicasOpt,
    low: Optional[int] = MinOpt,
    high: Optional[int] = MaxOpt,
    target: Optional[float] = TargetOpt,
    up_s: Optional[float] = UpOpt,
    down_s: Optional[float] = DownOpt,
    zero_s: Optional[float] = ZeroOpt,
    cold_s: Optional[float] = ColdOpt,
    ttft_ms: Optional[float] = TtftOpt,
    overflow: Optional[Overflow] = typer.Option(
        None, help="a base model's deployment: spill to its serverless deployment when at max replicas and target"
    ),
    team: Optional[str] = typer.Option(None, help="admin key only: whose deployment"),
    wait: bool = WaitOpt,
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Deploy a checkpoint on capacity of its own (a Dynamo graph for this deployment alone)."""
    body = replicas_body(replicas, low, high, target, up_s, down_s, zero_s, cold_s, ttft_ms)
    if overflow:
        body["overflow"] = overflow.value
    create(Api(profile, set_, url, api_key), model, name, body, team, wait)


@deployments_app.command("list")
def deployments_list(
    url: Optional[str] = UrlOpt, api_key: Optional[str] = KeyOpt, profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt
):
    """The key's team's deployments (the admin's: all), and the capacity pool."""
    got = Api(profile, set_, url, api_key).call("GET", "/v1/deployments")
    table = Table("id", "team", "served_model", "version", "status", "replicas", "replica-hours", "usd")
    for d in got["data"]:
        r = d["replicas"]
        table.add_row(
            d["id"], d["team"] or "(shared)", d["served_model"], d["checkpoint_version"], d["status"],
            f"{r['ready']}/{r['desired']}", f"{d['replica_seconds'] / 3600:.4f}", f"{d['cost_usd']:.4f}",
        )  # fmt: skip
    console.print(table)
    cap = got["capacity"]
    console.print(f"capacity: {cap['held']} of {cap['slots']} slots held, {cap['free']} free")


@deployments_app.command("get")
def deployments_get(
    dep_id: str,
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """One deployment, as JSON, and its last autoscaling decisions."""
    _show(Api(profile, set_, url, api_key).call("GET", f"/v1/deployments/{dep_id}"))


@deployments_app.command("scale")
def deployments_scale(
    dep_id: str,
    replicas: Optional[int] = ReplicasOpt,
    low: Optional[int] = MinOpt,
    high: Optional[int] = MaxOpt,
    target: Optional[float] = TargetOpt,
    up_s: Optional[float] = UpOpt,
    down_s: Optional[float] = DownOpt,
    zero_s: Optional[float] = ZeroOpt,
    cold_s: Optional[float] = ColdOpt,
    ttft_ms: Optional[float] = TtftOpt,
    wait: bool = WaitOpt,
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Set the replicas (a count, or a range to autoscale in); scale-down drains a replica before it stops."""
    body = replicas_body(replicas, low, high, target, up_s, down_s, zero_s, cold_s, ttft_ms)
    api = Api(profile, set_, url, api_key)
    dep = api.call("POST", f"/v1/deployments/{dep_id}/scale", body)
    if wait:
        dep = api.follow(dep)
    console.print(f"{dep_id}: {dep['status']}, replicas {dep['replicas']['ready']}/{dep['replicas']['desired']}")


@deployments_app.command("delete")
def deployments_delete(
    dep_id: str,
    wait: bool = WaitOpt,
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Take it out of routing now; it stops once its requests in flight have finished."""
    api = Api(profile, set_, url, api_key)
    dep = api.call("DELETE", f"/v1/deployments/{dep_id}")
    console.print(f"{dep_id}: {dep['status']}")
    if wait:
        api.follow(dep, until_gone=True)
