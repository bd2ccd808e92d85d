"""Declaring workflows in Python: :class:`Workflow`, :class:`Batch`, ``chain``, ``group``,
``chord``. Nothing here touches the database; :mod:`sa_jobs._insert.workflow` writes a
declared workflow in one go.

Steps are added in order and may only wait for steps added before them, so a workflow is
acyclic by construction — and the insert gives each step a larger id than every step it
waits for, an order :mod:`sa_jobs._act.workflow_release` relies on to lock rows without
deadlocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal, Unpack

import attrs

from sa_jobs._declare.args import encode_args
from sa_jobs._declare.options import InsertOptions, InsertOpts, insert_opts
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError, InvalidWorkflowError

__all__ = [
    "Batch",
    "DependencyFailure",
    "Step",
    "StepRef",
    "Workflow",
    "chain",
    "chord",
    "group",
]

DependencyFailure = Literal["cancel", "run"]
_FAILURE_MODES = ("cancel", "run")


def check_failure_mode(value: object) -> DependencyFailure:
    if value not in _FAILURE_MODES:
        raise InvalidOptionsError(
            "on_dependency_failure",
            f"must be 'cancel' (the step is cancelled when a dependency fails) or 'run' (it "
            f"runs anyway), got {value!r}",
        )
    mode: DependencyFailure = value  # type: ignore[assignment]
    return mode


@attrs.frozen(eq=False)
class Step:
    """A step of a :class:`Workflow` (what :meth:`Workflow.add` returns); pass it in
    another step's ``after=``. After :func:`~sa_jobs.insert_workflow`, ``job_id`` is set."""

    workflow: Workflow = attrs.field(repr=False)
    index: int
    name: str
    kind: str
    args: object = attrs.field(repr=False)
    opts: InsertOpts = attrs.field(repr=False)
    after: tuple[Step, ...]
    on_dependency_failure: DependencyFailure

    @property
    def job_id(self) -> int:
        """The step's job id, once its workflow was inserted."""
        ids = self.workflow.job_ids
        if ids is None:
            raise InvalidWorkflowError(
                f"step {self.name!r} has no job id yet: insert its workflow first "
                "(sa_jobs.insert_workflow)"
            )
        return ids[self.index]


#: What ``after=`` takes: a step, the name of a step, or (``add_to_workflow``) the job id
#: of a step already in the database.
StepRef = Step | str | int


def _callback(role: str, value: object) -> tuple[object, InsertOpts] | None:
    """A callback given as job args, or as ``(args, InsertOpts)``; refused otherwise."""
    if value is None:
        return None
    args, opts = value if isinstance(value, tuple) and len(value) == 2 else (value, InsertOpts())
    if not isinstance(opts, InsertOpts):
        raise InvalidWorkflowError(f"{role}: a pair's second item must be an sa_jobs.InsertOpts")
    try:
        encode_args(args)
    except InvalidJobArgsError as exc:
        raise InvalidWorkflowError(
            f"{role} must be job args (an instance of a @sa_jobs.job_args class), or "
            f"(args, sa_jobs.InsertOpts(...)): {exc}"
        ) from None
    return args, opts


class Workflow:
    """A set of jobs where some wait for others: a DAG, inserted in one transaction by
    :func:`sa_jobs.insert_workflow`.

    ``on_dependency_failure`` is what a step does when a step it waits for is cancelled or
    discarded: ``"cancel"`` (the default; recursively) or ``"run"`` (as if it had
    completed). A step may override it. ``on_success``/``on_complete``/``on_failure``
    are callback jobs (``docs/workflows.md``).
    """

    def __init__(
        self,
        name: str,
        *,
        on_dependency_failure: DependencyFailure = "cancel",
        on_success: object = None,
        on_complete: object = None,
        on_failure: object = None,
    ) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            raise InvalidOptionsError("name", f"must be a string of 1-255 characters, got {name!r}")
        self.name = name
        self.on_dependency_failure = check_failure_mode(on_dependency_failure)
        self.callbacks = {
            role: found
            for role, value in (
                ("on_success", on_success),
                ("on_complete", on_complete),
                ("on_failure", on_failure),
            )
            if (found := _callback(role, value)) is not None
        }
        self.steps: list[Step] = []
        self._names: dict[str, Step] = {}
        self._kind_counts: Counter[str] = Counter()
        #: Set by insert_workflow: the id of the workflow row, and each step's job id.
        self.id: int | None = None
        self.job_ids: list[int] | None = None

    def add(
        self,
        args: object,
        *,
        after: Iterable[StepRef] = (),
        name: str | None = None,
        on_dependency_failure: DependencyFailure | None = None,
        opts: InsertOpts | None = None,
        **options: Unpack[InsertOptions],
    ) -> Step:
        """Add a step running ``args`` once every step in ``after`` completed.

        ``name`` defaults to the kind for the first step of a kind, then ``kind.2``,
        ``kind.3``... in the order they are added. Insert options (``queue``,
        ``priority``, ``max_attempts``, ``tags``, ``metadata``, ``scheduled_at``) apply as
        for :func:`sa_jobs.insert`; ``unique``, ``sequence`` and ``job_key`` are refused.

        Raises:
            InvalidWorkflowError: ``after`` names something that is not an earlier step of
                this workflow, or the name is taken.
        """
        if self.job_ids is not None:
            raise InvalidWorkflowError(
                f"workflow {self.name!r} was inserted already; add steps to it with "
                "sa_jobs.add_to_workflow(session, workflow_id, ...)"
            )
        kind, _ = encode_args(args)
        resolved_opts = insert_opts(opts, options)
        refuse_keyed_options(resolved_opts)
        self._kind_counts[kind.name] += 1
        if name is None:
            count = self._kind_counts[kind.name]
            name = kind.name if count == 1 else f"{kind.name}.{count}"
        check_step_name(name)
        if name in self._names:
            raise InvalidWorkflowError(
                f"workflow {self.name!r} already has a step named {name!r}; give this one "
                "another name= (step names are how output_of() and workflow_status() "
                "refer to steps)"
            )
        deps = tuple(self._resolve(ref) for ref in after)
        mode = check_failure_mode(on_dependency_failure or self.on_dependency_failure)
        step = Step(self, len(self.steps), name, kind.name, args, resolved_opts, deps, mode)
        self.steps.append(step)
        self._names[name] = step
        return step

    def _resolve(self, ref: object) -> Step:
        if isinstance(ref, Step):
            if ref.workflow is not self:
                raise InvalidWorkflowError(
                    f"step {ref.name!r} belongs to workflow {ref.workflow.name!r}, not "
                    f"{self.name!r}; a step can only wait for steps of its own workflow"
                )
            return ref
        if isinstance(ref, str):
            found = self._names.get(ref)
            if found is None:
                raise InvalidWorkflowError(
                    f"after={ref!r}: workflow {self.name!r} has no step of that name (yet); "
                    f"its steps: {', '.join(self._names) or 'none'}"
                )
            return found
        raise InvalidWorkflowError(
            f"after= takes steps (what Workflow.add returns) or step names, got {ref!r}; a job "
            "already in the database can be waited for with sa_jobs.add_to_workflow"
        )

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r} steps={len(self.steps)} id={self.id}>"


class Batch(Workflow):
    """A workflow without edges: jobs that run independently, plus callbacks once they
    all finished (Sidekiq's batches)."""

    def __init__(
        self,
        name: str = "batch",
        *,
        on_success: object = None,
        on_complete: object = None,
        on_failure: object = None,
    ) -> None:
        super().__init__(
            name, on_success=on_success, on_complete=on_complete, on_failure=on_failure
        )

    def add(  # type: ignore[override]
        self,
        args: object,
        *,
        name: str | None = None,
        opts: InsertOpts | None = None,
        **options: Unpack[InsertOptions],
    ) -> Step:
        """Add a job to the batch (insert options as for :func:`sa_jobs.insert`)."""
        return super().add(args, name=name, opts=opts, **options)

    def add_many(self, items: Iterable[object]) -> list[Step]:
        """Add several jobs with default names and options."""
        return [self.add(args) for args in items]


def refuse_keyed_options(opts: InsertOpts) -> None:
    """Steps are neither unique nor sequenced nor keyed (``docs/workflows.md`` says why)."""
    for option in ("unique", "sequence", "job_key"):
        value = getattr(opts, option)
        if option == "unique" and value is not None and value.is_empty:
            continue  # UniqueOpts(): the kind's uniqueness turned off, which a step needs
        if value is not None:
            raise InvalidWorkflowError(
                f"a workflow step cannot take {option}=: a skipped duplicate or a replaced "
                "job would leave the steps waiting for it with nothing to wait for; insert "
                "the job on its own, or drop the option"
            )


def check_step_name(name: object) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise InvalidWorkflowError(
            f"a step name must be a string of 1-255 characters, got {name!r}"
        )


def chain(*items: object, name: str = "chain") -> Workflow:
    """A workflow where each job waits for the one before (Celery's ``chain``)."""
    if not items:
        raise InvalidWorkflowError("chain() needs at least one job")
    workflow = Workflow(name)
    previous: list[Step] = []
    for args in items:
        previous = [workflow.add(args, after=previous)]
    return workflow


def group(*items: object, name: str = "group") -> Workflow:
    """A workflow of jobs that run in parallel (Celery's ``group``)."""
    if not items:
        raise InvalidWorkflowError("group() needs at least one job")
    workflow = Workflow(name)
    for args in items:
        workflow.add(args)
    return workflow


def chord(
    jobs: Workflow | Sequence[object],
    callback: object,
    *,
    name: str = "chord",
    on_dependency_failure: DependencyFailure = "cancel",
) -> Workflow:
    """The jobs of a ``group`` (or a list of args) in parallel, then ``callback`` once
    they all completed (Celery's ``chord``): the callback is a step waiting for every one
    of them, so it can read their outputs with ``job.output_of(name)``."""
    workflow = Workflow(name, on_dependency_failure=on_dependency_failure)
    if isinstance(jobs, Workflow):
        if any(step.after for step in jobs.steps):
            raise InvalidWorkflowError("chord() takes a group (steps without after=), not a DAG")
        members = [workflow.add(s.args, name=s.name, opts=s.opts) for s in jobs.steps]
    else:
        members = [workflow.add(args) for args in jobs]
    if not members:
        raise InvalidWorkflowError("chord() needs at least one job before its callback")
    workflow.add(callback, after=members)
    return workflow
