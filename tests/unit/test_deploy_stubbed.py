"""`deploy` and `delete_endpoint` against botocore's Stubber: what moto cannot model (an endpoint scaled
out by Application Auto Scaling, an update SageMaker rolls back, a throttled status check, a caller
without scaling rights), with every request checked against botocore's service model."""

from __future__ import annotations

from typing import Any

import pytest

from smtriton.aws.deploy import MANAGED_TAG, AsyncInference, AutoScaling, Aws, EndpointSpec, delete_endpoint, deploy
from tests.unit.aws_stubs import ANY, Clients, arn, endpoint, endpoint_config, model

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker"
DATA = "s3://models/demo/model.tar.gz"
GPU = "ml.g5.xlarge"
# The InferenceAmiVersion a GPU type gets by default: the newest NVIDIA driver botocore's model documents.
NEWEST_GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
OLD = "live-20260101000000-aaaa"  # the configuration and model in service before the update
TARGET = {
    "ServiceNamespace": "sagemaker",
    "ResourceId": "endpoint/live/variant/AllTraffic",
    "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
}
TRACKING = {
    "TargetValue": 100.0,
    "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
    "ScaleInCooldown": 300,
    "ScaleOutCooldown": 60,
}


def spec(name: str = "live", **kw: Any) -> EndpointSpec:
    fields = {"image": IMAGE, "role_arn": ROLE, "model_data": DATA, "instance_type": GPU}
    return EndpointSpec(name=name, **(fields | kw))


class Run:
    """Progress and sleeps recorded; the clock moves only when the code sleeps."""

    def __init__(self, clients: Clients) -> None:
        self.aws = Aws(sagemaker=clients.sagemaker, autoscaling=clients.autoscaling)
        self.aws.cloudwatch = clients.cloudwatch  # set after construction: optional clients
        self.aws.s3 = clients.s3
        self.aws.ecr = clients.ecr
        self.messages: list[str] = []
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return sum(self.sleeps)

    def deploy(self, endpoint_spec: EndpointSpec, **kw: Any):
        return deploy(
            self.aws,
            endpoint_spec,
            progress=self.messages.append,
            poll_s=1.0,
            sleep=self.sleeps.append,
            clock=self.clock,
            **kw,
        )

    def delete(self, name: str, **kw: Any):
        return delete_endpoint(
            self.aws, name, progress=self.messages.append, poll_s=1.0, sleep=self.sleeps.append, clock=self.clock, **kw
        )


NEW = "live-new"  # the name deploy gives the new configuration and model (fixed here)


@pytest.fixture
def clients(monkeypatch):
    monkeypatch.setattr("smtriton.aws.deploy.resource_name", lambda base: f"{base}-new")
    with Clients() as stubbed:
        yield stubbed


def managed(c: Clients, kind: str, name: str, endpoint_name: str = "live") -> None:
    c.answer(
        "sagemaker", "list_tags", {"Tags": [{"Key": MANAGED_TAG, "Value": endpoint_name}]}, ResourceArn=arn(kind, name)
    )


def scaled(c: Clients, low: int, high: int, policies: list[dict[str, Any]] | None = None) -> None:
    target = {**TARGET, "MinCapacity": low, "MaxCapacity": high, "RoleARN": "arn:aws:iam::1:role/x", "CreationTime": 0}
    c.answer(
        "autoscaling",
        "describe_scalable_targets",
        {"ScalableTargets": [target]},
        ServiceNamespace="sagemaker",
        ResourceIds=[TARGET["ResourceId"]],
        ScalableDimension=TARGET["ScalableDimension"],
    )
    if policies is None:
        policies = [
            {
                "PolicyARN": "arn:aws:autoscaling:policy/old",
                "PolicyName": "live-invocations-per-instance",
                **TARGET,
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingScalingPolicyConfiguration": TRACKING,
                "CreationTime": 0,
            }
        ]
    c.answer(
        "autoscaling",
        "describe_scaling_policies",
        {"ScalingPolicies": policies},
        ServiceNamespace="sagemaker",
        ResourceId=TARGET["ResourceId"],
        ScalableDimension=TARGET["ScalableDimension"],
    )


def registered(c: Clients, low: int, high: int) -> None:
    """The variant registered (again) with these limits and the invocations tracking policy."""
    c.answer("autoscaling", "register_scalable_target", {}, **TARGET, MinCapacity=low, MaxCapacity=high)
    c.answer(
        "autoscaling",
        "put_scaling_policy",
        {"PolicyARN": "arn:aws:autoscaling:policy/new"},
        PolicyName="live-invocations-per-instance",
        **TARGET,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration=TRACKING,
    )


def in_service(
    c: Clients, instances: int, instance_type: str = GPU, scaled_to: tuple[int, int] | None = (1, 8)
) -> None:
    """The endpoint `live` in service on OLD, with `instances` instances; what deploy reads before an update."""
    c.answer(
        "sagemaker", "describe_endpoint", endpoint("live", "InService", OLD, instances=instances), EndpointName="live"
    )
    managed(c, "endpoint", "live")
    c.answer(
        "sagemaker",
        "describe_endpoint_config",
        endpoint_config(OLD, OLD, InstanceType=instance_type, InitialInstanceCount=1, InitialVariantWeight=1.0),
        EndpointConfigName=OLD,
    )
    c.answer(
        "sagemaker",
        "describe_model",
        model(OLD, {"Image": IMAGE, "Mode": "SingleModel", "ModelDataUrl": DATA}, ROLE),
        ModelName=OLD,
    )
    if scaled_to is None:
        c.answer("autoscaling", "describe_scalable_targets", {"ScalableTargets": []})
    else:
        scaled(c, *scaled_to)
    c.answer("s3", "head_object", {"ETag": '"0123abcd"'}, Bucket="models", Key="demo/model.tar.gz")


def new_resources(c: Clients, instances: int, instance_type: str = GPU) -> None:
    # the archive's ETag goes with the model, for the next deploy to compare with
    tagged = [{"Key": MANAGED_TAG, "Value": "live"}, {"Key": "smtriton:model-data-etag", "Value": "0123abcd"}]
    c.answer(
        "sagemaker",
        "create_model",
        {"ModelArn": arn("model", NEW)},
        ModelName=NEW,
        ExecutionRoleArn=ROLE,
        PrimaryContainer=ANY,
        Tags=tagged,
    )
    variant = {
        "VariantName": "AllTraffic",
        "ModelName": NEW,
        "InstanceType": instance_type,
        "InitialInstanceCount": instances,
        "InitialVariantWeight": 1.0,
    }
    if instance_type.startswith(("ml.g", "ml.p")):
        variant["InferenceAmiVersion"] = NEWEST_GPU_AMI
    c.answer(
        "sagemaker",
        "create_endpoint_config",
        {"EndpointConfigArn": arn("endpoint-config", "new")},
        EndpointConfigName=NEW,
        ProductionVariants=[variant],
        Tags=ANY,
    )


def updated(c: Clients, *, rolled_back: str | None = None) -> None:
    """UpdateEndpoint, one check while Updating, then in service (on OLD again if rolled back)."""
    c.answer(
        "sagemaker",
        "update_endpoint",
        {"EndpointArn": arn("endpoint", "live")},
        EndpointName="live",
        EndpointConfigName=NEW,
    )
    c.answer("sagemaker", "describe_endpoint", endpoint("live", "Updating", OLD))
    if rolled_back:
        c.answer("sagemaker", "describe_endpoint", endpoint("live", "InService", OLD, reason=rolled_back))
    else:
        c.answer("sagemaker", "describe_endpoint", endpoint("live", "InService", NEW))


def old_deleted(c: Clients, described: bool = False) -> None:
    """The configuration and model in service before are deleted (the configuration read first, unless it was)."""
    if not described:
        c.answer(
            "sagemaker", "describe_endpoint_config", endpoint_config(OLD, OLD, InstanceType=GPU, InitialInstanceCount=1)
        )
    managed(c, "endpoint-config", OLD)
    c.answer("sagemaker", "delete_endpoint_config", {}, EndpointConfigName=OLD)
    c.answer("sagemaker", "describe_model", model(OLD, {"Image": IMAGE}, ROLE))
    managed(c, "model", OLD)
    c.answer("sagemaker", "delete_model", {}, ModelName=OLD)


def test_a_redeploy_of_a_scaled_out_endpoint_keeps_its_instance_count_and_its_scaling(clients):
    """Scaled to 8 by Application Auto Scaling, --instance-count 1: the new configuration asks for the 8
    serving now, and the scaling registration is left alone (neither deregistered nor replaced)."""
    in_service(clients, instances=8)
    new_resources(clients, instances=8)
    updated(clients)
    old_deleted(clients)
    run = Run(clients)
    result = run.deploy(spec(environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}))
    assert result.updated
    assert any("keeping 8 instances" in m for m in run.messages)


def test_the_kept_count_stays_inside_new_scaling_limits(clients):
    in_service(clients, instances=8)
    new_resources(clients, instances=4)
    updated(clients)
    registered(clients, 2, 4)
    old_deleted(clients)
    Run(clients).deploy(spec(environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}, autoscaling=AutoScaling(2, 4)))


def test_a_redeploy_of_an_endpoint_that_is_not_scaled_keeps_its_instance_count(clients):
    """3 instances, no auto-scaling, a new image and no --instance-count: the new configuration asks
    for the 3 serving now (an image update must not cut capacity), and says so."""
    in_service(clients, instances=3, scaled_to=None)
    new_resources(clients, instances=3)
    updated(clients)
    old_deleted(clients)
    run = Run(clients)
    assert run.deploy(spec(environment={"SAGEMAKER_TRITON_LOG_INFO": "false"})).updated
    assert "keeping 3 instances: the endpoint runs 3 now (--instance-count changes it)" in run.messages


def test_an_endpoint_that_is_not_scaled_takes_the_count_asked_for(clients):
    in_service(clients, instances=3, scaled_to=None)
    new_resources(clients, instances=1)
    updated(clients)
    old_deleted(clients)
    run = Run(clients)
    run.deploy(spec(instance_count=1, environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}))
    assert not any(m.startswith("keeping") for m in run.messages)


def test_a_new_instance_type_rolled_back_by_sagemaker_gets_its_scaling_back(clients):
    """Application Auto Scaling refuses an update to another instance type while the variant is
    registered: deregistered first; the update rolled back, the registration is put back as it was."""
    in_service(clients, instances=8)
    clients.answer("autoscaling", "deregister_scalable_target", {}, **TARGET)
    new_resources(clients, instances=1, instance_type="ml.g5.2xlarge")
    updated(clients, rolled_back="The new model failed its health check")
    clients.answer("sagemaker", "delete_endpoint_config", {}, EndpointConfigName=NEW)
    clients.answer("sagemaker", "delete_model", {}, ModelName=NEW)
    registered(clients, 1, 8)
    run = Run(clients)
    with pytest.raises(Exception, match="previous configuration still serves: The new model failed its health check"):
        run.deploy(spec(instance_type="ml.g5.2xlarge", environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}))
    assert any("restored" in m for m in run.messages)


def test_a_new_instance_type_that_succeeds_keeps_the_scaling_it_had(clients):
    in_service(clients, instances=8)
    clients.answer("autoscaling", "deregister_scalable_target", {}, **TARGET)
    new_resources(clients, instances=1, instance_type="ml.g5.2xlarge")
    updated(clients)
    registered(clients, 1, 8)
    old_deleted(clients)
    Run(clients).deploy(spec(instance_type="ml.g5.2xlarge", environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}))


@pytest.mark.parametrize(("asked", "runs"), [(1, 1), (None, 8)])
def test_scaling_is_removed_only_when_asked(clients, asked, runs):
    """Removed, the variant runs the --instance-count asked for, else the instances it runs now: nothing
    would ever change it again."""
    in_service(clients, instances=8)
    new_resources(clients, instances=runs)
    updated(clients)
    clients.answer("autoscaling", "deregister_scalable_target", {}, **TARGET)
    old_deleted(clients)
    run = Run(clients)
    run.deploy(spec(instance_count=asked, environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}, remove_autoscaling=True))
    assert any(m.startswith("keeping 8 instances") for m in run.messages) == (asked is None)


def created(c: Clients, name: str, statuses: list[str]) -> None:
    c.fail("sagemaker", "describe_endpoint", "ValidationException", f'Could not find endpoint "{name}".')
    c.answer("s3", "head_object", {"ETag": '"0123abcd"'})
    c.answer("sagemaker", "create_model", {"ModelArn": arn("model", name)})
    c.answer("sagemaker", "create_endpoint_config", {"EndpointConfigArn": arn("endpoint-config", name)})
    c.answer("sagemaker", "create_endpoint", {"EndpointArn": arn("endpoint", name)})
    for status in statuses:
        if status == "Throttled":
            c.fail("sagemaker", "describe_endpoint", "ThrottlingException", "Rate exceeded")
        elif status == "ExpiredToken":
            c.fail("sagemaker", "describe_endpoint", "ExpiredTokenException", "The security token has expired")
        else:
            c.answer("sagemaker", "describe_endpoint", endpoint(name, status, "cfg"))


def test_async_with_a_minimum_of_zero_gets_the_backlog_policies_that_bring_it_back(clients):
    created(clients, "queue", ["Creating", "InService"])
    where = {**TARGET, "ResourceId": "endpoint/queue/variant/AllTraffic"}
    clients.answer("autoscaling", "register_scalable_target", {}, **where, MinCapacity=0, MaxCapacity=4)
    backlog = {
        "MetricName": "ApproximateBacklogSizePerInstance",
        "Namespace": "AWS/SageMaker",
        "Dimensions": [{"Name": "EndpointName", "Value": "queue"}],
        "Statistic": "Average",
    }
    clients.answer(
        "autoscaling",
        "put_scaling_policy",
        {"PolicyARN": "arn:aws:autoscaling:policy/backlog"},
        PolicyName="queue-backlog-per-instance",
        **where,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 5.0,
            "CustomizedMetricSpecification": backlog,
            "ScaleInCooldown": 300,
            "ScaleOutCooldown": 60,
        },
    )
    step = "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:1:resource/sagemaker/endpoint/queue:policyName/w"
    clients.answer(
        "autoscaling",
        "put_scaling_policy",
        {"PolicyARN": step},
        PolicyName="queue-has-backlog-without-capacity",
        **where,
        PolicyType="StepScaling",
        StepScalingPolicyConfiguration={
            "AdjustmentType": "ChangeInCapacity",
            "MetricAggregationType": "Average",
            "Cooldown": 60,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
        },
    )
    clients.answer(
        "cloudwatch",
        "put_metric_alarm",
        {},
        AlarmName="smtriton-queue-has-backlog-without-capacity",
        AlarmDescription=ANY,
        MetricName="HasBacklogWithoutCapacity",
        Namespace="AWS/SageMaker",
        Statistic="Average",
        Dimensions=[{"Name": "EndpointName", "Value": "queue"}],
        Period=60,
        EvaluationPeriods=2,
        DatapointsToAlarm=2,
        Threshold=1.0,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="missing",
        AlarmActions=[step],
    )
    run = Run(clients)
    run.deploy(
        spec(
            "queue",
            instance_type="ml.m5.xlarge",
            async_inference=AsyncInference("s3://out/"),
            autoscaling=AutoScaling(0, 4),
        )
    )
    assert any("HasBacklogWithoutCapacity" in m for m in run.messages)


@pytest.mark.parametrize("trouble", ["Throttled", "ExpiredToken"])
def test_an_error_while_checking_the_status_keeps_polling_and_never_rolls_back(clients, trouble):
    created(clients, "fresh", ["Creating", trouble, trouble, "Creating", "InService"])
    run = Run(clients)
    result = run.deploy(spec("fresh"))
    assert not result.updated
    assert run.sleeps == [1.0, 2.0, 4.0, 1.0]  # the pause doubles while the status cannot be read
    assert sum("status not read" in m for m in run.messages) == 2


def test_only_a_failed_status_fails_a_create(clients):
    created(clients, "broken", ["Creating", "Throttled", "Failed"])
    # the roll-back: the endpoint, then the configuration and model made for it
    clients.answer("sagemaker", "delete_endpoint", {}, EndpointName="broken")
    clients.fail("sagemaker", "describe_endpoint", "ValidationException", 'Could not find endpoint "broken".')
    clients.answer("sagemaker", "delete_endpoint_config", {}, EndpointConfigName=ANY)
    clients.answer("sagemaker", "delete_model", {}, ModelName=ANY)
    run = Run(clients)
    with pytest.raises(Exception, match="endpoint broken is Failed"):
        run.deploy(spec("broken"))


def test_delete_without_application_auto_scaling_rights_deletes_the_endpoint_and_says_what_it_could_not_check(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("live", "InService", OLD), EndpointName="live")
    managed(clients, "endpoint", "live")
    clients.answer(
        "sagemaker", "describe_endpoint_config", endpoint_config(OLD, OLD, InstanceType=GPU, InitialInstanceCount=1)
    )
    clients.fail(
        "autoscaling",
        "describe_scalable_targets",
        "AccessDeniedException",
        "not authorized to perform: application-autoscaling:DescribeScalableTargets",
    )
    clients.answer("sagemaker", "delete_endpoint", {}, EndpointName="live")
    clients.answer("sagemaker", "describe_endpoint", endpoint("live", "Deleting", OLD))
    clients.fail("sagemaker", "describe_endpoint", "ValidationException", 'Could not find endpoint "live".')
    old_deleted(clients, described=True)
    clients.answer("sagemaker", "list_endpoint_configs", {"EndpointConfigs": []}, NameContains="live")
    clients.answer("sagemaker", "list_models", {"Models": []}, NameContains="live")
    run = Run(clients)
    removed = run.delete("live")
    assert removed == ["endpoint/live", f"endpoint-config/{OLD}", f"model/{OLD}"]
    (warning,) = [m for m in run.messages if m.startswith("warning:")]
    assert "application-autoscaling:DescribeScalableTargets" in warning


DIGEST = "sha256:" + "ab" * 32


def same_as_deployed(c: Clients, digest_now: str) -> None:  # as this smtriton deployed it
    """`live` runs IMAGE (resolved to DIGEST when deployed) and DATA (ETag 0123abcd), not auto-scaled."""
    c.answer(
        "sagemaker", "describe_endpoint", endpoint("live", "InService", OLD, instances=1, image=IMAGE, digest=DIGEST)
    )
    managed(c, "endpoint", "live")
    c.answer(
        "sagemaker",
        "describe_endpoint_config",
        endpoint_config(
            OLD,
            OLD,
            InstanceType=GPU,
            InitialInstanceCount=1,
            InitialVariantWeight=1.0,
            InferenceAmiVersion=NEWEST_GPU_AMI,
        ),
    )
    c.answer(
        "sagemaker", "describe_model", model(OLD, {"Image": IMAGE, "Mode": "SingleModel", "ModelDataUrl": DATA}, ROLE)
    )
    c.answer("autoscaling", "describe_scalable_targets", {"ScalableTargets": []})
    c.answer("s3", "head_object", {"ETag": '"0123abcd"'}, Bucket="models", Key="demo/model.tar.gz")
    c.answer(
        "ecr",
        "describe_images",
        {"imageDetails": [{"imageDigest": digest_now}]},
        registryId="123456789012",
        repositoryName="smtriton",
        imageIds=[{"imageTag": "1"}],
    )


def test_an_identical_redeploy_changes_nothing(clients):
    same_as_deployed(clients, DIGEST)
    clients.answer(
        "sagemaker",
        "list_tags",
        {"Tags": [{"Key": "smtriton:model-data-etag", "Value": "0123abcd"}]},
        ResourceArn=arn("model", OLD),
    )
    run = Run(clients)
    result = run.deploy(spec())
    assert (result.unchanged, result.updated, result.config_name) == (True, False, OLD)
    assert "endpoint live unchanged: it already runs this image, model data and configuration" in run.messages


def test_a_tag_pushed_again_is_a_change(clients):
    same_as_deployed(clients, "sha256:" + "cd" * 32)
    new_resources(clients, instances=1)
    updated(clients)
    old_deleted(clients)
    run = Run(clients)
    assert run.deploy(spec()).updated
    assert any("the image may have changed" in m for m in run.messages)


def test_a_model_archive_uploaded_again_is_a_change(clients):
    same_as_deployed(clients, DIGEST)
    clients.answer("sagemaker", "list_tags", {"Tags": [{"Key": "smtriton:model-data-etag", "Value": "99999999"}]})
    new_resources(clients, instances=1)
    updated(clients)
    old_deleted(clients)
    run = Run(clients)
    assert run.deploy(spec()).updated
    assert any("the model archive may have changed" in m for m in run.messages)
