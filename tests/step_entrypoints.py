"""Entry points used by the DataPrepOperator tests (imported by the step's child process)."""

from __future__ import annotations

from tideflow.steps import StepContext


def boom(ctx: StepContext, reason: str = "deliberately broken") -> dict[str, str]:
    print(f"about to fail in step {ctx.step}")
    raise ValueError(reason)


def emit_marker(ctx: StepContext) -> dict[str, str]:
    return {"marker": f"{ctx.dag_id}/{ctx.run_id}"}


def forgets_an_output(ctx: StepContext) -> dict[str, str]:
    return {"train": "file:///tmp/train.npz"}


def report_device(ctx: StepContext, **args: object) -> dict[str, float | str]:
    import os

    print(
        f"device class {os.environ['TIDEFLOW_DEVICE_CLASS']}, "
        f"emulated {os.environ['TIDEFLOW_EMULATED']}, "
        f"cuda {os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    )
    return {"accuracy": 0.5, "loss": 1.0}


def report_types(ctx: StepContext, **args: object) -> dict[str, str]:
    """Outputs each argument as ``type:repr`` so a test can see exactly what arrived."""
    return {name: f"{type(value).__name__}:{value!r}" for name, value in args.items()}


def score_checkpoint(
    ctx: StepContext, checkpoint_store: str, checkpoint_step: int, **args: object
) -> dict[str, float]:
    """Scores the checkpoint it is given as its training run did (its val_accuracy)."""
    from tideflow.checkpoint import CheckpointManager

    manifest = CheckpointManager(checkpoint_store).load(int(checkpoint_step))
    accuracy = float(manifest.metrics["val_accuracy"])
    print(f"scored checkpoint step {manifest.step}: accuracy {accuracy:.4f}")
    return {"accuracy": accuracy, "loss": 1.0 - accuracy}


def log_constant_model(ctx: StepContext, run_id: str, **args: object) -> dict[str, str]:
    """A promotion builder: a tiny real MLflow model logged into the promotion's run."""
    import mlflow
    import mlflow.pyfunc

    class Constant(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
        def predict(self, context, model_input):  # type: ignore[no-untyped-def]
            return [1] * len(model_input)

    with mlflow.start_run(run_id=run_id):
        # stated, as the example builder does: inferring them imports the model in a process
        info = mlflow.pyfunc.log_model(
            name="model", python_model=Constant(), pip_requirements=["mlflow"]
        )
    return {"model_uri": str(info.model_uri)}
