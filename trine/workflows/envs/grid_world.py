"""A small text grid world (FrozenLake-like) for step-wise RL, in pure Python.

The agent starts on ``S`` and must reach the goal ``G`` without stepping on a hole ``H``; other
cells are frozen ``F``. Layouts are drawn deterministically from ``(size, holes, seed)``, always
with a path from start to goal. The action is read from the model's reply (a word, a letter
``u/d/l/r`` or an arrow). Three observation views (``view=``):

- ``"grid"`` (default): the grid as text (the agent shown as ``A``) plus a one-line instruction;
- ``"compact"``: the grid plus one line per action naming the cell it leads to (``"up F"``);
- ``"local"``: the four cells next to the agent, in up/down/left/right order (``W``: the wall),
  then where the goal lies (``u``/``d``/``-`` by row, ``l``/``r``/``-`` by column), e.g.
  ``"F W H F u r"``: free above, wall below, hole left, free right; the goal is up and to the
  right. A tiny model learns to walk toward the goal around holes in a few dozen RL steps, which
  it does not with the full grid.

::

    env = GridWorld(size=4, seed=3, max_steps=8)
    obs = env.reset()
    obs, reward, done, info = env.step("I will go right")

Rewards are sparse: 1.0 when the agent reaches ``G`` (episode ends), 0.0 otherwise; falling into a
hole ends the episode with 0.0, and so does running out of ``max_steps``. :meth:`GridWorld.state_hash`
identifies (layout, agent position), so equal states in different rollouts of one layout get equal
hashes: GiGPO's anchor states.

:class:`GridWorldEnv` is the same game on the Gymnasium-style text API (``reset(seed=,
options=) -> (observation, info)``, ``step`` -> ``(observation, reward, terminated, truncated,
info)``): the ``grid_world`` environment and workflow drive it through the one adapter every
environment goes through (:class:`~trine.workflows.envs.base.BlockingEnvironment`).

``grid_world_tasks`` makes taskset rows for the ``"grid_world"`` workflow, and
``write_example_data`` writes ``examples/grid_world/data/{train,eval}.jsonl``.
``format_warmup_rows`` makes supervised rows (an observation -> a *random* valid action) that
teach a model from scratch the reply format, not the solution; ``write_learning_data`` writes them
(local view, one-letter actions) to ``examples/grid_world/data/warmup.jsonl``, with
``train_balanced.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

ACTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
"""Action name -> (row delta, column delta)."""

_ALIASES = {
    "u": "up",
    "d": "down",
    "l": "left",
    "r": "right",
    "↑": "up",
    "↓": "down",
    "←": "left",
    "→": "right",
}
_ACTION_RE = re.compile(
    r"(?<![\w'])(up|down|left|right|u|d|l|r)(?![\w'])|([↑↓←→])",
    re.IGNORECASE,
)
CELLS = "SFHG"
VIEWS = ("grid", "compact", "local")

INSTRUCTION = "You are A. Reach G, avoid H. Actions: up, down, left, right. Reply with one action."


def parse_action(text: str) -> str | None:
    """The last action named in ``text`` (``up/down/left/right``, ``U/D/L/R`` or an arrow), or None.

    Matching is case-insensitive and on whole words, so ``"upper"`` or ``"I'd"`` name no action.
    """
    found = None
    for match in _ACTION_RE.finditer(text or ""):
        word = (match.group(1) or match.group(2)).lower()
        found = _ALIASES.get(word, word)
    return found


def default_holes(size: int) -> int:
    """The default number of holes: one per eight cells (at least one)."""
    return max(1, size * size // 8)


def make_layout(size: int, holes: int, seed: int) -> list[str]:
    """A ``size`` x ``size`` layout (rows of ``S/F/H/G``) drawn deterministically from ``seed``.

    Start and goal are distinct random cells; a random shortest (monotone) path joins them and the
    holes are placed off that path, so the goal is always reachable.
    """
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size={size!r}; expected an integer >= 2 (the grid is size x size).")
    free = size * size - (2 * size - 1)  # cells off even the longest monotone path
    if not isinstance(holes, int) or not 0 <= holes <= free:
        raise ValueError(f"holes={holes!r}; expected an integer in [0, {free}] for size={size}.")
    rng = random.Random(f"grid-world/{size}/{holes}/{seed}")  # str seeds are stable across processes
    cells = [(r, c) for r in range(size) for c in range(size)]
    start, goal = rng.sample(cells, 2)
    path = _random_path(start, goal, rng)
    holes_at = set(rng.sample([cell for cell in cells if cell not in path], holes))
    grid = [["F"] * size for _ in range(size)]
    for r, c in holes_at:
        grid[r][c] = "H"
    grid[start[0]][start[1]] = "S"
    grid[goal[0]][goal[1]] = "G"
    return ["".join(row) for row in grid]


def _random_path(start: tuple[int, int], goal: tuple[int, int], rng: random.Random) -> set[tuple[int, int]]:
    (r, c), (gr, gc) = start, goal
    moves = [(1 if gr > r else -1, 0)] * abs(gr - r) + [(0, 1 if gc > c else -1)] * abs(gc - c)
    rng.shuffle(moves)
    path = {start}
    for dr, dc in moves:
        r, c = r + dr, c + dc
        path.add((r, c))
    return path


def reachable(layout: list[str]) -> bool:
    """Whether ``G`` can be reached from ``S`` without crossing ``H`` (breadth-first search)."""
    size = len(layout)
    start = next((r, row.index("S")) for r, row in enumerate(layout) if "S" in row)
    seen, frontier = {start}, [start]
    while frontier:
        r, c = frontier.pop()
        if layout[r][c] == "G":
            return True
        for dr, dc in ACTIONS.values():
            nr, nc = r + dr, c + dc
            if (
                0 <= nr < size
                and 0 <= nc < len(layout[nr])
                and (nr, nc) not in seen
                and layout[nr][nc] != "H"
            ):
                seen.add((nr, nc))
                frontier.append((nr, nc))
    return False


class GridWorld:
    """A FrozenLake-like text environment: ``reset() -> obs``, ``step(text) -> (obs, r, done, info)``.

    Args:
        size: the grid is ``size`` x ``size``.
        holes: number of holes (default :func:`default_holes`).
        seed: picks the layout; equal ``(size, holes, seed)`` give equal layouts in any process.
        max_steps: the episode ends (reward 0) after this many actions, valid or not.
        layout: explicit rows of ``S/F/H/G`` (one ``S``, one ``G``) instead of a drawn layout.
    """

    blocking = False
    """Pure, fast Python: ``step_wise`` calls it inline in the event loop, not in a worker thread."""

    def __init__(
        self,
        size: int = 4,
        holes: int | None = None,
        seed: int = 0,
        max_steps: int = 8,
        layout: list[str] | None = None,
        view: str = "grid",
    ) -> None:
        if view not in VIEWS:
            raise ValueError(f"view={view!r}; expected one of {VIEWS}.")
        self.view = view
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r}; expected an integer >= 1.")
        self.layout = (
            _check_layout(layout)
            if layout is not None
            else make_layout(size, default_holes(size) if holes is None else holes, seed)
        )
        self.size = len(self.layout)
        self.max_steps = max_steps
        self.start = next((r, row.index("S")) for r, row in enumerate(self.layout) if "S" in row)
        self.goal = next((r, row.index("G")) for r, row in enumerate(self.layout) if "G" in row)
        self.position = self.start
        self.steps = 0
        self.invalid_actions = 0
        self.done = False

    def reset(self) -> str:
        """Put the agent back on ``S``; returns the first observation."""
        self.position, self.steps, self.invalid_actions, self.done = self.start, 0, 0, False
        return self.observation()

    def observation(self) -> str:
        """The observation of the current state in this env's ``view``.

        - ``grid``: the grid (cells separated by spaces, the agent as ``A``) and the instruction;
        - ``compact``: the grid and :meth:`neighbours_text` (``"up F"`` ... one line per action);
        - ``local``: the four neighbouring cells in ``up down left right`` order (``W`` for the
          wall), then :meth:`goal_direction`: ``"W F H G - r"`` = wall above, ``F`` below, hole left,
          goal right (same row).
        """
        if self.view == "local":
            cells = " ".join(line.split()[1] for line in self.neighbours_text().splitlines())
            return cells + " " + self.goal_direction()
        if self.view == "compact":
            return self.grid_text() + "\n" + self.neighbours_text()
        return self.grid_text() + "\n" + INSTRUCTION

    def goal_direction(self) -> str:
        """Where the goal lies: ``u``/``d``/``-`` (row) and ``l``/``r``/``-`` (column), e.g. ``"u r"``."""
        (r, c), (gr, gc) = self.position, self.goal
        return ("u" if gr < r else "d" if gr > r else "-") + " " + ("l" if gc < c else "r" if gc > c else "-")

    def grid_text(self) -> str:
        """The grid rows, cells separated by spaces, the agent shown as ``A``."""
        rows = []
        for r, row in enumerate(self.layout):
            cells = ["A" if (r, c) == self.position else cell for c, cell in enumerate(row)]
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def neighbours_text(self) -> str:
        """One line per action naming the cell it leads to (``W``: the wall), e.g. ``"up F"``."""
        lines = []
        for action, (dr, dc) in ACTIONS.items():
            r, c = self.position[0] + dr, self.position[1] + dc
            inside = 0 <= r < self.size and 0 <= c < self.size
            lines.append(f"{action} {self.layout[r][c] if inside else 'W'}")
        return "\n".join(lines)

    def cell(self) -> str:
        """The layout letter under the agent."""
        r, c = self.position
        return self.layout[r][c]

    def state_hash(self) -> str:
        """A stable hash of (layout, agent position): equal states give equal hashes across rollouts."""
        key = "/".join(self.layout) + f"@{self.position[0]},{self.position[1]}"
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply the last action named in ``action_text``; an unparseable reply does not move.

        Moving off the grid leaves the agent in place (``info["bumped"]``). Returns
        ``(observation, reward, done, info)``.
        """
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset() to start a new one.")
        action = parse_action(action_text)
        self.steps += 1
        bumped = False
        if action is None:
            self.invalid_actions += 1
        else:
            dr, dc = ACTIONS[action]
            r, c = self.position[0] + dr, self.position[1] + dc
            if 0 <= r < self.size and 0 <= c < self.size:
                self.position = (r, c)
            else:
                bumped = True
        cell = self.cell()
        success, fell = cell == "G", cell == "H"
        self.done = success or fell or self.steps >= self.max_steps
        info = {
            "action": action,
            "invalid_action": action is None,
            "invalid_actions": self.invalid_actions,
            "bumped": bumped,
            "success": success,
            "fell": fell,
            "steps": self.steps,
        }
        return self.observation(), 1.0 if success else 0.0, self.done, info


class GridWorldEnv:
    """The grid world on the Gymnasium-style text API (what the ``grid_world`` environment name and
    workflow use): ``reset(seed=, options=) -> (observation, info)``, ``step(text) -> (observation,
    reward, terminated, truncated, info)``, ``state_hash()``.

    Each ``reset`` starts a :class:`GridWorld` from the constructor's arguments, updated by
    ``options`` (any of ``size``, ``holes``, ``max_steps``, ``layout``, ``view``); ``seed`` (when
    given) picks the layout, so one object serves any row. Observations, rewards, ``info`` and state
    hashes are :class:`GridWorld`'s; ``terminated`` means the goal or a hole was reached,
    ``truncated`` that ``max_steps`` ran out first. Arguments as for :class:`GridWorld`.
    """

    blocking = False
    """Pure, fast Python: called inline in the event loop, not in a worker thread."""
    option_names = ("size", "holes", "max_steps", "layout", "view")

    def __init__(
        self,
        size: int = 4,
        holes: int | None = None,
        seed: int = 0,
        max_steps: int = 8,
        layout: list[str] | None = None,
        view: str = "grid",
    ) -> None:
        self.config: dict[str, Any] = {
            "size": size,
            "holes": holes,
            "seed": seed,
            "max_steps": max_steps,
            "layout": layout,
            "view": view,
        }
        self.game = GridWorld(**self.config)  # checks the arguments now

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """A new episode: the layout of ``seed`` (else the constructor's) with ``options`` applied."""
        config = dict(self.config)
        unknown = set(options or {}) - set(self.option_names)
        if unknown:
            raise ValueError(
                f"options {sorted(unknown)} are not grid-world options; expected {self.option_names}."
            )
        config.update(options or {})
        if seed is not None:
            config["seed"] = seed
        self.game = GridWorld(**config)
        return self.game.reset(), {"layout": list(self.game.layout)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the last action named in ``action`` (see :meth:`GridWorld.step`)."""
        observation, reward, done, info = self.game.step(action)
        terminated = bool(info["success"] or info["fell"])
        return observation, reward, terminated, done and not terminated, info

    def state_hash(self) -> str:
        """(layout, agent position), as :meth:`GridWorld.state_hash`."""
        return self.game.state_hash()


def _check_layout(layout: list[str]) -> list[str]:
    rows = [str(row) for row in layout]
    size = len(rows)
    text = "".join(rows)
    if (
        size < 2
        or any(len(row) != size for row in rows)
        or set(text) - set(CELLS)
        or text.count("S") != 1
        or text.count("G") != 1
    ):
        raise ValueError(
            f"layout={layout!r}; expected a square list of rows of {CELLS!r} letters with exactly one S "
            "and one G, e.g. ['SF', 'HG']."
        )
    return rows


def grid_world_tasks(
    n: int, *, size: int = 4, seed: int = 0, max_steps: int = 8, holes: int | None = None
) -> list[dict[str, Any]]:
    """``n`` taskset rows for the ``"grid_world"`` workflow, layouts seeded ``seed .. seed + n - 1``.

    Each row is ``{"question", "size", "seed", "holes", "max_steps"}``; ``question`` is a short
    description (use ``prompt_key="question"``, ``answer_key=None``).
    """
    holes = default_holes(size) if holes is None else holes
    return [
        {
            "question": f"Grid world {size}x{size}, layout {s}: walk from S to G without stepping on H.",
            "size": size,
            "seed": s,
            "holes": holes,
            "max_steps": max_steps,
        }
        for s in range(seed, seed + n)
    ]


def write_example_data(directory: str | Path = "examples/grid_world/data") -> list[Path]:
    """Write the grid-world example data: 32 train and 16 eval 3x3 layouts (one hole), eval layouts
    distinct from the train ones."""
    train = grid_world_tasks(32, size=3, seed=0, max_steps=6, holes=1)
    seen = {tuple(make_layout(r["size"], r["holes"], r["seed"])) for r in train}
    eval_rows = []
    for row in grid_world_tasks(200, size=3, seed=1000, max_steps=6, holes=1):
        layout = tuple(make_layout(row["size"], row["holes"], row["seed"]))
        if layout not in seen and len(eval_rows) < 16:
            seen.add(layout)
            eval_rows.append(row)
    out = []
    for name, rows in (("train", train), ("eval", eval_rows)):
        path = Path(directory) / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        out.append(path)
    return out


def format_warmup_rows(
    n: int,
    *,
    size: int = 3,
    holes: int | None = None,
    seed: int = 0,
    layouts: int = 256,
    view: str = "grid",
    letters: bool = False,
) -> list[dict[str, str]]:
    """``n`` supervised rows ``{"question": observation, "answer": random action}``.

    Each row shows a random state (the agent on a random non-hole, non-goal cell) of one of
    ``layouts`` random layouts (seeds ``seed*layouts + 10**6 ..``, away from the example
    train/eval seeds), as the step-wise workflow shows it in ``view``: the observation is the whole
    user message (no system prompt). The answer is uniformly random (``up/down/left/right``, or
    ``u/d/l/r`` with ``letters=True``), so a model trained on these rows learns *how* to reply but
    not *which* action solves the layout: its success rate stays near a random policy's.
    Deterministic in ``seed``.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}; expected an integer >= 1 (rows to make).")
    if not isinstance(layouts, int) or layouts < 1:
        raise ValueError(f"layouts={layouts!r}; expected an integer >= 1 (distinct layouts to draw from).")
    holes = default_holes(size) if holes is None else holes
    rng = random.Random(f"grid-world-warmup/{size}/{holes}/{seed}")
    first = 10**6 + seed * layouts
    envs = [GridWorld(size=size, holes=holes, seed=first + i, view=view) for i in range(layouts)]
    rows = []
    for _ in range(n):
        env = rng.choice(envs)
        cells = [(r, c) for r, row in enumerate(env.layout) for c, cell in enumerate(row) if cell in "SF"]
        env.position = rng.choice(cells)
        action = rng.choice(list(ACTIONS))
        rows.append({"question": env.observation(), "answer": action[0] if letters else action})
    return rows


def symmetries(layout: list[str]) -> list[list[str]]:
    """The 8 images of a square ``layout`` under rotations and reflections (possibly repeated)."""
    grid = [list(row) for row in layout]
    out = []
    for _ in range(4):
        grid = [list(row) for row in zip(*grid[::-1])]  # rotate 90 degrees clockwise
        out += [["".join(row) for row in grid], ["".join(row[::-1]) for row in grid]]
    return out


def balanced_grid_world_tasks(
    n: int,
    *,
    size: int = 3,
    holes: int | None = None,
    seed: int = 0,
    max_steps: int = 8,
    exclude: list[list[str]] | None = None,
) -> list[dict[str, Any]]:
    """Rows with explicit ``layout``: the 8 symmetric images of layouts seeded ``seed ..
    seed + n - 1``, deduplicated, minus the layouts in ``exclude`` (e.g. an eval set).

    Closing the set under rotations and reflections makes every direction equally often the
    right one, so a policy cannot gain reward by a state-independent preference for one action
    (which a few random layouts allow: the 32 example train layouts have the goal left of the
    start 15 times and right of it 7 times).
    """
    holes = default_holes(size) if holes is None else holes
    seen = {tuple(layout) for layout in exclude or []}
    rows = []
    for s in range(seed, seed + n):
        for layout in symmetries(make_layout(size, holes, s)):
            if tuple(layout) in seen:
                continue
            seen.add(tuple(layout))
            rows.append(
                {
                    "question": f"Grid world {size}x{size}: {'/'.join(layout)}. Walk from S to G without stepping on H.",
                    "layout": layout,
                    "max_steps": max_steps,
                }
            )
    return rows


def write_learning_data(directory: str | Path = "examples/grid_world/data") -> list[Path]:
    """Write the data of ``examples/grid_world/config.yaml`` besides ``train/eval.jsonl``:
    ``warmup.jsonl`` (2048 :func:`format_warmup_rows`, one hole, ``local`` view, one-letter
    answers) and ``train_balanced.jsonl``
    (:func:`balanced_grid_world_tasks` of 32 layouts, without the ``eval.jsonl`` layouts)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    evals = [json.loads(line) for line in (directory / "eval.jsonl").read_text(encoding="utf-8").splitlines()]
    exclude = [make_layout(r["size"], r["holes"], r["seed"]) for r in evals]
    data = {
        "warmup.jsonl": format_warmup_rows(2048, size=3, holes=1, seed=0, view="local", letters=True),
        "train_balanced.jsonl": balanced_grid_world_tasks(
            32, size=3, holes=1, seed=0, max_steps=6, exclude=exclude
        ),
    }
    for name, rows in data.items():
        (directory / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return [directory / name for name in data]
