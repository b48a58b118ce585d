"""Inference components: several models on one endpoint's instances, each with its copies and its share
of accelerators, CPU cores and memory.

A component runs a SageMaker model of the serving image (made here, tagged like everything else for
its endpoint); a second deploy of the same component updates it in place (SageMaker replaces its copies
a few at a time) and deletes the model it ran before. Deleting an endpoint deletes its components first,
since SageMaker refuses to delete an endpoint that still hosts one. Each copy gets ``--cpu-cores`` of
the instance's CPUs as its own CPU quota, which is what the container sizes its workers by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from smtriton.aws.model import ServingModel
from smtriton.aws.resources import (
    MANAGED_TAG,
    DeployError,
    WaitTimeout,
    check_name,
    described_or_none,
    is_managed,
    resource_name,
    tags,
)
from smtriton.aws.scaling import VARIANT
from smtriton.aws.waiting import Poller

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Component:
    """``accelerators``: GPUs (or Inferentia cores) per copy; ``memory_mb``: the memory a copy is
    guaranteed; ``cpu_cores``: the CPUs a copy gets (its CPU quota)."""

    name: str
    copies: int = 1
    accelerators: float | None = None
    memory_mb: int = 1024
    cpu_cores: float | None = None

    def check(self) -> None:
        check_name(self.name, "inference component name")
        if self.copies < 1:
            raise DeployError("an inference component needs at least 1 copy")
        if self.memory_mb < 128:
            raise DeployError("an inference component copy needs at least 128 MB of memory (--memory-mb)")
        if self.cpu_cores is not None and self.cpu_cores < 0.25:
            raise DeployError("an inference component copy needs at least 0.25 CPU cores (--cpu-cores)")
        if self.accelerators is not None and self.accelerators < 1:
            raise DeployError("an inference component copy needs at least 1 accelerator, or none (--accelerators)")


@dataclass(frozen=True)
class ComponentResult:
    arn: str
    model_name: str
    updated: bool


def specification(
    component: Component, model_name: str, startup_timeout_s: int | None, download_timeout_s: int | None
) -> dict[str, Any]:
    """The component's ``Specification``: its model, its start-up limits and each copy's resources."""
    resources: dict[str, Any] = {"MinMemoryRequiredInMb": component.memory_mb}
    if component.cpu_cores is not None:
        resources["NumberOfCpuCoresRequired"] = float(component.cpu_cores)
    if component.accelerators is not None:
        resources["NumberOfAcceleratorDevicesRequired"] = float(component.accelerators)
    spec: dict[str, Any] = {"ModelName": model_name, "ComputeResourceRequirements": resources}
    startup = {
        key: value
        for key, value in (("ModelDataDownloadTimeoutInSeconds", download_timeout_s),
                           ("ContainerStartupHealthCheckTimeoutInSeconds", startup_timeout_s))
        if value is not None
    }  # fmt: skip
    if startup:
        spec["StartupParameters"] = startup
    return spec


def describe(sm: Any, name: str) -> dict[str, Any] | None:
    return described_or_none(sm.describe_inference_component, InferenceComponentName=name)


def _wait(poller: Poller, sm: Any, name: str, gone: bool = False) -> Mapping[str, Any] | None:
    return poller.until(
        f"inference component {name}",
        lambda: describe(sm, name),
        status_key="InferenceComponentStatus",
        done=() if gone else {"InService"},
        failed={"Failed"},
        gone_is_done=gone,
        hint="" if gone else f" (smtriton delete-endpoint ENDPOINT --inference-component {name} removes it)",
    )


def deploy_component(
    sm: Any,
    component: Component,
    endpoint: str,
    model: ServingModel,
    *,
    extra_tags: Mapping[str, str],
    startup_timeout_s: int | None,
    poller: Poller,
    progress: Progress,
) -> ComponentResult:
    """Create the component on ``endpoint`` (a new one that fails is removed again), or update it in place."""
    existing = describe(sm, component.name)
    if existing is not None:
        if not is_managed(sm, existing["InferenceComponentArn"], endpoint):
            raise DeployError(
                f"inference component {component.name} exists and was not made by smtriton for {endpoint}"
            )
        if existing["EndpointName"] != endpoint:
            raise DeployError(f"inference component {component.name} runs on endpoint {existing['EndpointName']}")
    model_name = resource_name(component.name)
    own_tags = tags(MANAGED_TAG, endpoint, extra_tags)
    sm.create_model(**model.request(model_name, own_tags))
    progress(f"created model {model_name}")
    spec = specification(component, model_name, startup_timeout_s, model.hosting.model_download_timeout_s)
    runtime = {"CopyCount": component.copies}
    if existing is None:
        try:
            arn = sm.create_inference_component(
                InferenceComponentName=component.name, EndpointName=endpoint, VariantName=VARIANT,
                Specification=spec, RuntimeConfig=runtime, Tags=own_tags,
            )["InferenceComponentArn"]  # fmt: skip
        except Exception:
            sm.delete_model(ModelName=model_name)
            raise
        progress(f"creating inference component {component.name} ({component.copies} copies)")
        try:
            _wait(poller, sm, component.name)
        except WaitTimeout:
            raise
        except DeployError:
            progress(f"rolling back inference component {component.name}")
            _remove(sm, component.name, model_name, endpoint, True, poller, progress)
            raise
        return ComponentResult(arn, model_name, updated=False)

    old_model = _model_of(existing)
    try:
        sm.update_inference_component(InferenceComponentName=component.name, Specification=spec, RuntimeConfig=runtime)
    except Exception:
        sm.delete_model(ModelName=model_name)
        raise
    progress(f"updating inference component {component.name}: model {old_model} -> {model_name}")
    try:
        described = _wait(poller, sm, component.name)
    except WaitTimeout:
        raise
    except DeployError:
        described = describe(sm, component.name)
        if _model_of(described) == model_name:  # it failed on the new model: nothing went back to remove
            raise
    running = _model_of(described)
    if running != model_name:
        sm.delete_model(ModelName=model_name)
        reason = (described or {}).get("FailureReason") or "SageMaker rolled the update back"
        raise DeployError(
            f"update of inference component {component.name} failed, the previous model still serves: {reason}"
        )
    if old_model:
        _delete_model(sm, old_model, endpoint, False, progress)
    return ComponentResult(existing["InferenceComponentArn"], model_name, updated=True)


def _model_of(described: Mapping[str, Any] | None) -> str | None:
    return ((described or {}).get("Specification") or {}).get("ModelName")


def _delete_model(sm: Any, name: str, endpoint: str, force: bool, progress: Progress) -> bool:
    described = described_or_none(sm.describe_model, ModelName=name)
    if described is None or (not force and not is_managed(sm, described["ModelArn"], endpoint)):
        return False
    sm.delete_model(ModelName=name)
    progress(f"deleted model {name}")
    return True


def _remove(
    sm: Any, name: str, model_name: str | None, endpoint: str, force: bool, poller: Poller, progress: Progress
) -> list[str]:
    """Delete a component, wait until it is gone, then delete the model it ran (if ours, or forced)."""
    sm.delete_inference_component(InferenceComponentName=name)
    progress(f"deleting inference component {name}")
    _wait(poller, sm, name, gone=True)
    removed = [f"inference-component/{name}"]
    if model_name and _delete_model(sm, model_name, endpoint, force, progress):
        removed.append(f"model/{model_name}")
    return removed


def delete_components(
    sm: Any, endpoint: str, *, only: str | None = None, force: bool = False, poller: Poller, progress: Progress
) -> list[str]:
    """Delete the endpoint's components (or the one named ``only``) and the models they ran; one smtriton
    did not make stops it all, unless ``force``."""
    names = [
        c["InferenceComponentName"]
        for page in sm.get_paginator("list_inference_components").paginate(EndpointNameEquals=endpoint)
        for c in page["InferenceComponents"]
    ]
    if only is not None:
        if only not in names:
            raise DeployError(f"endpoint {endpoint} has no inference component {only}")
        names = [only]
    described = [d for d in (describe(sm, n) for n in names) if d is not None]
    theirs = [
        d["InferenceComponentName"] for d in described if not is_managed(sm, d["InferenceComponentArn"], endpoint)
    ]
    if theirs and not force:
        raise DeployError(
            f"endpoint {endpoint} hosts inference components smtriton did not make ({', '.join(theirs)}); "
            "pass force to delete them too"
        )
    removed = []
    for d in described:
        removed += _remove(sm, d["InferenceComponentName"], _model_of(d), endpoint, force, poller, progress)
    return removed
