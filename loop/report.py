"""What `flywheel loop` shows: each phase timed, a line per turn, a table and a PNG at the end.

With ``--json`` the human output goes to stderr, so stdout holds the JSON document alone.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table


class Reporter:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        stream = sys.stderr if quiet else sys.stdout
        self.console = Console(stderr=quiet, width=None if stream.isatty() else 120)

    @contextmanager
    def phase(self, title: str):
        t0 = time.monotonic()
        self.console.print(f"[bold]{title}[/] ...")
        yield
        self.console.print(f"[dim]{title}: {time.monotonic() - t0:.1f} s[/]")

    def progress(self, label: str):
        """A callback (step, total, loss) that prints every tenth of the way."""

        def show(step: int, total: int, loss: float) -> None:
            if step == total or step % max(total // 10, 1) == 0:
                self.console.print(f"  {label}: step {step}/{total}, loss {loss:.3f}")

        return show

    def turn(self, t: dict) -> None:
        ev = t["eval"]
        line = (
            f"[bold]turn {t['turn']}[/] ({t['version']}): eval reward {ev['reward_mean']:.3f}, "
            f"exact-solve {ev['exact_solve']:.3f} over {ev['n']} held-back tasks"
        )
        if t["turn"]:
            gap = t["train"].get("off_policy_gap")
            what = "production traces" if t["rollouts"].get("source") == "production" else "rollouts"
            line += (
                f"; {t['rollouts']['n']} {what} (reward {t['rollouts']['reward_mean']:.3f}), "
                f"{t['rollouts']['tokens'] + ev['tokens']} tokens"
                + (f", off-policy gap {gap:.4f} nats/token" if gap is not None else "")
            )
        if "canary" in t:
            from feedback.canary import DONE

            c = t["canary"]
            line += f"; canary {t['candidate']} {DONE[c['action']]}: {c['reason']}"
        self.console.print(line)
        for example_id, reply, reward in ev["examples"]:
            self.console.print(f"  {example_id}: {reply!r} -> {reward:.2f}")

    def canary(self, decision) -> None:
        """One look of a turn's canary controller."""
        f = decision.figures
        seen = ", ".join(
            f"{arm} {f[arm]['rewarded']} rewarded (mean {f[arm]['mean']:.3f})"
            for arm in ("baseline", "candidate")
            if f.get(arm) and f[arm]["mean"] is not None
        )
        self.console.print(f"  canary: {decision.action}: {decision.reason}" + (f" [{seen}]" if seen else ""))

    def final(self, result: dict) -> None:
        table = Table(title=f"loop {result['run_id']}: {result['env']} ({result['algo']})")
        for col in (
            "turn",
            "reward",
            "exact",
            "rollouts",
            "tokens",
            "off-policy gap",
            "rollouts s",
            "export s",
            "train s",
            "swap s",
            "eval s",
        ):
            table.add_column(col, justify="right")
        for t in result["turns"]:
            ev, s = t["eval"], t.get("seconds", {})
            gap = (t.get("train") or {}).get("off_policy_gap")
            table.add_row(
                str(t["turn"]),
                f"{ev['reward_mean']:.3f}",
                f"{ev['exact_solve']:.3f}",
                str(t.get("rollouts", {}).get("n", "-")),
                str(t.get("rollouts", {}).get("tokens", 0) + ev["tokens"]),
                "-" if gap is None else f"{gap:.4f}",
                *(f"{s[p]:.1f}" if p in s else "-" for p in ("rollouts", "export", "train", "deploy", "eval")),
            )
        self.console.print(table)
        verdict = "[green]improved[/]" if result["improved"] else "[red]did not improve[/]"
        self.console.print(f"{verdict}; plot {result['plot']}; {result['wall_s']:.0f} s in all")
        ui = result["ui"]
        self.console.print(
            f"checkpoints, traces and rewards in the browser: {ui['url']} (log in with the "
            f"key in {ui['key_file']}){'' if ui['stack_stays_up'] else '; run `flywheel up` first'}"
        )
        if self.quiet:
            json.dump(result, sys.stdout, indent=2)
            sys.stdout.write("\n")

    def plot(self, turns: list[dict], path: Path, lc) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [t["turn"] for t in turns]
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
        ax.plot(xs, [t["eval"]["reward_mean"] for t in turns], marker="o", label="mean reward")
        ax.plot(xs, [t["eval"]["exact_solve"] for t in turns], marker="s", label="exact-solve rate")
        ax.set_xticks(xs)
        ax.set_xlabel("loop turn (0 = warmed base)")
        ax.set_ylabel("greedy eval, held-back tasks")
        ax.set_title(f"{lc.env} ({lc.algo}): per turn", fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
