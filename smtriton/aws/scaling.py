"""Application Auto Scaling of an endpoint's variant: the policies smtriton attaches, and keeping what
is attached across an update.

A real-time endpoint tracks ``SageMakerVariantInvocationsPerInstance``. An asynchronous endpoint
tracks its queue, ``ApproximateBacklogSizePerInstance``, as AWS's guidance for asynchronous inference
says; scaled down to zero instances it emits no per-instance metric at all, so with a minimum of 0 a
step policy on ``HasBacklogWithoutCapacity`` (a CloudWatch alarm smtriton creates) brings the first
instance back when requests queue up.

A scalable target's registration (limits and policies) is read as a :class:`Snapshot` before an
update touches it, so it can be put back when the update needs it removed (a new instance type) or
when SageMaker rolls the update back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Progress = Callable[[str], None]

VARIANT = "AllTraffic"
NAMESPACE = "sagemaker"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
INVOCATIONS_METRIC = "SageMakerVariantInvocationsPerInstance"
BACKLOG_METRIC = "ApproximateBacklogSizePerInstance"
NO_CAPACITY_METRIC = "HasBacklogWithoutCapacity"
DEFAULT_INVOCATIONS = 100.0  # invocations per instance per minute
DEFAULT_BACKLOG = 5.0  # queued requests per instance, AWS's example value
# What a policy's description carries into PutScalingPolicy.
_POLICY_FIELDS = ("PolicyType", "StepScalingPolicyConfiguration", "TargetTrackingScalingPolicyConfiguration",
                  "PredictiveScalingPolicyConfiguration")  # fmt: skip


@dataclass(frozen=True)
class AutoScaling:
    """``target``: invocations per instance per minute, or for an asynchronous endpoint queued requests
    per instance (None: :data:`DEFAULT_INVOCATIONS` / :data:`DEFAULT_BACKLOG`)."""

    min_capacity: int = 1
    max_capacity: int = 2
    target: float | None = None
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60

    def target_value(self, asynchronous: bool) -> float:
        if self.target is not None:
            return float(self.target)
        return DEFAULT_BACKLOG if asynchronous else DEFAULT_INVOCATIONS

    def describe(self, asynchronous: bool) -> str:
        metric = BACKLOG_METRIC if asynchronous else INVOCATIONS_METRIC
        text = f"{self.min_capacity}-{self.max_capacity} instances, target {self.target_value(asynchronous):g} {metric}"
        if self.wakes_from_zero(asynchronous):
            text += f", {NO_CAPACITY_METRIC} brings the first instance back"
        return text

    def wakes_from_zero(self, asynchronous: bool) -> bool:
        return asynchronous and self.min_capacity == 0


@dataclass(frozen=True)
class Snapshot:
    """A variant's registration as Application Auto Scaling describes it."""

    target: Mapping[str, Any]
    policies: tuple[Mapping[str, Any], ...] = field(default=())

    @property
    def limits(self) -> tuple[int, int]:
        return int(self.target["MinCapacity"]), int(self.target["MaxCapacity"])


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def _where(endpoint: str) -> dict[str, str]:
    return {"ServiceNamespace": NAMESPACE, "ResourceId": resource_id(endpoint), "ScalableDimension": SCALABLE_DIMENSION}


def tracking_policy_name(endpoint: str, asynchronous: bool) -> str:
    return f"{endpoint}-{'backlog' if asynchronous else 'invocations'}-per-instance"


def wake_policy_name(endpoint: str) -> str:
    return f"{endpoint}-has-backlog-without-capacity"


def wake_alarm_name(endpoint: str) -> str:
    return f"smtriton-{endpoint}-has-backlog-without-capacity"


def target_request(endpoint: str, scaling: AutoScaling) -> dict[str, Any]:
    """RegisterScalableTarget."""
    return {**_where(endpoint), "MinCapacity": scaling.min_capacity, "MaxCapacity": scaling.max_capacity}


def policy_requests(endpoint: str, scaling: AutoScaling, asynchronous: bool) -> list[dict[str, Any]]:
    """PutScalingPolicy, in order: the target tracking, then (asynchronous, min 0) the wake-up step policy."""
    if asynchronous:
        metric: dict[str, Any] = {
            "CustomizedMetricSpecification": {
                "MetricName": BACKLOG_METRIC,
                "Namespace": "AWS/SageMaker",
                "Dimensions": [{"Name": "EndpointName", "Value": endpoint}],
                "Statistic": "Average",
            }
        }
    else:
        metric = {"PredefinedMetricSpecification": {"PredefinedMetricType": INVOCATIONS_METRIC}}
    requests: list[dict[str, Any]] = [
        {
            "PolicyName": tracking_policy_name(endpoint, asynchronous),
            **_where(endpoint),
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": scaling.target_value(asynchronous),
                **metric,
                "ScaleInCooldown": scaling.scale_in_cooldown_s,
                "ScaleOutCooldown": scaling.scale_out_cooldown_s,
            },
        }
    ]
    if scaling.wakes_from_zero(asynchronous):
        requests.append(
            {
                "PolicyName": wake_policy_name(endpoint),
                **_where(endpoint),
                "PolicyType": "StepScaling",
                "StepScalingPolicyConfiguration": {
                    "AdjustmentType": "ChangeInCapacity",
                    "MetricAggregationType": "Average",
                    "Cooldown": scaling.scale_out_cooldown_s,
                    "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
                },
            }
        )
    return requests


def wake_alarm_request(endpoint: str, policy_arn: str) -> dict[str, Any]:
    """PutMetricAlarm: queued requests and no instance for two minutes run the wake-up step policy."""
    return {
        "AlarmName": wake_alarm_name(endpoint),
        "AlarmDescription": f"smtriton: requests wait for {endpoint} and no instance runs; scale out from zero",
        "MetricName": NO_CAPACITY_METRIC,
        "Namespace": "AWS/SageMaker",
        "Statistic": "Average",
        "Dimensions": [{"Name": "EndpointName", "Value": endpoint}],
        "Period": 60,
        "EvaluationPeriods": 2,
        "DatapointsToAlarm": 2,
        "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "TreatMissingData": "missing",
        "AlarmActions": [policy_arn],
    }


def read(aas: Any, endpoint: str) -> Snapshot | None:
    """The variant's registration, or None when it is not auto-scaled (ClientErrors propagate)."""
    where = _where(endpoint)
    found = aas.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[where["ResourceId"]], ScalableDimension=SCALABLE_DIMENSION
    )["ScalableTargets"]
    if not found:
        return None
    policies = aas.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=where["ResourceId"], ScalableDimension=SCALABLE_DIMENSION
    )["ScalingPolicies"]
    return Snapshot(found[0], tuple(policies))


def apply(
    aas: Any, cloudwatch: Any, endpoint: str, scaling: AutoScaling, asynchronous: bool, progress: Progress
) -> None:
    """Register the variant and put its policies (both replace what is there under the same names)."""
    aas.register_scalable_target(**target_request(endpoint, scaling))
    for request in policy_requests(endpoint, scaling, asynchronous):
        arn = aas.put_scaling_policy(**request)["PolicyARN"]
        if request["PolicyName"] == wake_policy_name(endpoint):
            cloudwatch.put_metric_alarm(**wake_alarm_request(endpoint, arn))
    progress(f"auto-scaling {scaling.describe(asynchronous)}")


def restore(aas: Any, cloudwatch: Any, endpoint: str, snapshot: Snapshot, progress: Progress) -> None:
    """Register the variant again as ``snapshot`` describes it, with the same policies."""
    target = {**_where(endpoint), "MinCapacity": snapshot.limits[0], "MaxCapacity": snapshot.limits[1]}
    if snapshot.target.get("SuspendedState"):
        target["SuspendedState"] = snapshot.target["SuspendedState"]
    aas.register_scalable_target(**target)
    for policy in snapshot.policies:
        request = {"PolicyName": policy["PolicyName"], **_where(endpoint)}
        request.update({key: policy[key] for key in _POLICY_FIELDS if key in policy})
        arn = aas.put_scaling_policy(**request)["PolicyARN"]
        if policy["PolicyName"] == wake_policy_name(endpoint):
            cloudwatch.put_metric_alarm(**wake_alarm_request(endpoint, arn))
        elif policy.get("PolicyType") == "StepScaling":
            progress(
                f"warning: step policy {policy['PolicyName']} was put back with a new ARN; the CloudWatch alarm "
                "that ran it still names the old one"
            )
    progress(f"auto-scaling of {resource_id(endpoint)} restored ({snapshot.limits[0]}-{snapshot.limits[1]} instances)")


def deregister(aas: Any, cloudwatch: Any, endpoint: str, snapshot: Snapshot, progress: Progress) -> None:
    """Remove the registration (Application Auto Scaling deletes its policies with it) and the wake-up
    alarm smtriton made for it."""
    aas.deregister_scalable_target(**_where(endpoint))
    ours = [
        alarm["AlarmName"]
        for policy in snapshot.policies
        if policy["PolicyName"] == wake_policy_name(endpoint)
        for alarm in policy.get("Alarms", [])
        if alarm["AlarmName"] == wake_alarm_name(endpoint)
    ]
    if ours:
        cloudwatch.delete_alarms(AlarmNames=ours)
    progress(f"deregistered auto-scaling of {resource_id(endpoint)}")
