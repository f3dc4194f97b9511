"""The words the generated reference adds to what the code says.

FIELD_HELP: what each pipeline or cluster file field means, where its JSON Schema
has no description.

Per kind of file, keyed by the field's path as the reference shows it
(`steps[].name`). The schema's own
description wins; `tests/project/test_docs_reference.py` fails when a path here is no longer
a field, or when a field is described in neither place.

EXIT_CODE_HELP: what each exit code means; a name is the constant in the code
that holds the number (docs/hooks/reference.py reads it from there).
"""

PIPELINE_HELP: dict[str, str] = {
    "apiVersion": "The format's version.",
    "kind": "What the file declares.",
    "metadata": "Name, team, schedule and how Airflow shows the DAG.",
    "metadata.description": "Shown as the DAG's description in Airflow.",
    "metadata.owners": "The DAG's owners in Airflow.",
    "metadata.tags": "Extra DAG tags; every pipeline's DAG is also tagged `tideflow` and "
    "`team:<team>`.",
    "params": "The run's typed parameters: Airflow's trigger form, `tideflow run --param`, "
    "and `{{ params.NAME }}` in any field.",
    "params.<name>.type": "The value's type; a value of another type is refused at trigger time.",
    "params.<name>.description": "Shown under the field in the trigger form.",
    "params.<name>.minimum": "Lowest value accepted (int and float params).",
    "params.<name>.maximum": "Highest value accepted (int and float params).",
    "steps": "The pipeline's steps; `needs` orders them.",
    "steps[].name": "The step's name: the Airflow task id.",
    "steps[].needs": "Names of the steps that must succeed before this one starts.",
    "steps[].retries": "Airflow retries of the task.",
    "steps[].timeout": "Execution timeout of one try, in seconds or as `90s`, `15m`, `2h30m`; "
    "a gang step's gang is stopped when it passes.",
    "steps[].data_prep": "A data preparation step: runs its entry point once, in a child process.",
    "steps[].data_prep.env": "Environment variables of the entry point's process.",
    "steps[].data_prep.resources": "CPU and memory the step asks for (its pod's requests on "
    "Kubernetes).",
    "steps[].data_prep.resources.cpu": "CPU cores.",
    "steps[].data_prep.resources.memory": "Memory in bytes or with a unit (`512Mi`, `4Gi`).",
    "steps[].gang_training": "A gang training step: `workers` processes that start together or "
    "not at all.",
    "steps[].gang_training.env": "Environment variables of every worker.",
    "steps[].gang_training.workers": "Number of worker processes (one pod each on Kubernetes).",
    "steps[].gang_training.devices_per_worker": "Devices of `device.class` each worker holds.",
    "steps[].gang_training.device": "The device class, and optionally the model, the gang runs on.",
    "steps[].gang_training.device.class": "`cpu`, `gpu` or `npu`; a class this machine lacks is "
    "emulated on the CPU by the local backend.",
    "steps[].gang_training.checkpoint": "Where and how often checkpoints are committed, and which "
    "are kept.",
    "steps[].gang_training.checkpoint.every_steps": "Commit a checkpoint every this many "
    "`save` calls.",
    "steps[].gang_training.checkpoint.every_seconds": "Commit a checkpoint at the first `save` "
    "this long after the last one (600 s when neither this, `every_steps` nor the script "
    "sets one).",
    "steps[].gang_training.checkpoint.keep_last": "Retention keeps the newest this many "
    "committed checkpoints (and never deletes the newest valid one).",
    "steps[].gang_training.checkpoint.keep_best": "Retention also keeps the best checkpoint by "
    "this metric; `evaluation.checkpoint: best` picks by it.",
    "steps[].gang_training.checkpoint.keep_best.metric": "A metric given to `save(step, "
    "metrics=...)`.",
    "steps[].gang_training.checkpoint.keep_best.mode": "Whether higher (`max`) or lower (`min`) "
    "is better.",
    "steps[].gang_training.max_restarts": "Whole-gang restarts after a worker fails; a "
    "preemption never counts.",
    "steps[].gang_training.priority": "The gang's priority when no priority class applies "
    "(higher goes first).",
    "steps[].gang_training.preemptible": "`false`: no other gang's priority preempts this one.",
    "steps[].gang_training.resources": "Per worker besides its devices: CPU (gpu and npu gangs) "
    "and memory.",
    "steps[].evaluation": "An evaluation step: scores one committed checkpoint of the nearest "
    "upstream gang step.",
    "steps[].evaluation.env": "Environment variables of the entry point's process.",
    "steps[].evaluation.metrics": "Metrics the entry point must return (a `dict` of numbers); a "
    "missing one fails the step.",
    "steps[].promote_checkpoint": "A promotion step: registers the evaluated checkpoint as a new "
    "model version if it passes the gate.",
    "steps[].promote_checkpoint.args": "Extra keyword arguments for the `builder`, after the "
    "checkpoint and `run_id` (a key set here wins).",
    "steps[].promote_checkpoint.alias": "The registry alias moved to a promoted version.",
    "steps[].promote_checkpoint.gate": "What a challenger must reach, and how it is compared "
    "with the champion.",
    "steps[].promote_checkpoint.gate.mode": "Whether higher (`max`) or lower (`min`) is better.",
}

CLUSTER_HELP: dict[str, str] = {
    "apiVersion": "The format's version.",
    "kind": "What the file declares.",
    "metadata": "The cluster's name.",
    "metadata.name": "The cluster's name (in messages).",
    "nodes": "The node groups gangs are placed on.",
    "nodes[].name": "The group's name.",
    "nodes[].count": "Identical nodes in the group.",
    "nodes[].cpu": "CPU cores per node.",
    "nodes[].memory": "Memory per node, in bytes or with a unit (`512Gi`).",
    "nodes[].accelerators": "The accelerators of each node; none for a CPU node.",
    "nodes[].accelerators.class": "`gpu` or `npu`.",
    "nodes[].accelerators.count": "Accelerators per node.",
    "nodes[].labels": "The nodes' Kubernetes labels; `compile --target kueue` makes "
    "ResourceFlavors of them.",
    "priority_classes": "Named priorities teams' gangs may run at.",
    "priority_classes[].name": "The class's name, as pipelines and teams give it.",
    "priority_classes[].description": "Shown with the class.",
    "teams": "Teams and their quotas; without teams, every gang draws from one shared pool.",
    "teams[].name": "The team's name, as pipelines give it in `metadata.team`.",
    "teams[].quota": "The team's nominal quota per device class (and model).",
    "teams[].quota[].device": "The device class the quota counts.",
    "teams[].quota[].nominal": "Devices the team owns: its gangs within it are never stopped "
    "by another team.",
    "teams[].default_priority_class": "The class of the team's runs that name none.",
    "borrowing": "Who may borrow whose idle quota, and on what terms.",
    "borrowing[].lender": "The team whose idle quota is lent.",
    "borrowing[].borrower": "The team that may borrow it.",
    "scheduling": "Reservations and fair sharing.",
}

FIELD_HELP: dict[str, dict[str, str]] = {"pipeline": PIPELINE_HELP, "cluster": CLUSTER_HELP}

EXIT_CODE_HELP: list[tuple[int | str, str, str]] = [
    (0, "every command", "success (`validate`: every file valid; `run`: the run succeeded)"),
    (
        1,
        "`tideflow`",
        "a pipeline or cluster file is invalid, a `--param` is refused, or the run failed",
    ),
    (
        2,
        "`tideflow`",
        "a setting is refused (the message names the variable and what "
        "is accepted), or the command line is wrong",
    ),
    (
        130,
        "`tideflow run`",
        "interrupted (Ctrl-C or SIGTERM); the run's gangs are stopped and their leases freed",
    ),
    (
        "EXIT_BAD_ENTRYPOINT",
        "step process",
        "the entry point could not be loaded (import error, or not a function)",
    ),
    (
        "EXIT_BAD_OUTPUTS",
        "step process",
        "the entry point returned something other than "
        "a mapping of names to strings (paths, URIs) or numbers (metrics)",
    ),
    (
        "EXIT_PREEMPTED",
        "gang worker",
        "preempted after committing a checkpoint: resumable; "
        "every backend resumes it, and it does not count as a restart",
    ),
    (
        "EXIT_UNHEALTHY",
        "gang worker",
        "stopped by the health guard (non-finite or "
        "exploding metric); `last-good` marked; never restarted",
    ),
    (
        "EXIT_HUNG",
        "gang worker",
        "no `save` for the step's `hang_timeout`: stacks dumped; "
        "the gang restarts, and a second hang at the same step fails it",
    ),
    (
        "EXIT_STOPPED",
        "gang pod, Argo gang driver",
        "stopped from outside by SIGTERM "
        "(evicted, deleted, `argo stop`); not a failure of the code",
    ),
]
