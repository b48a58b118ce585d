"""The deployment options big or regulated deployments need, shared by endpoints, inference components
and batch transform jobs: each option goes where the SageMaker API takes it for that kind of
deployment, and is refused in one line where it has no place.

- model download timeout: an endpoint variant's ``ModelDataDownloadTimeoutInSeconds``; a component's
  ``StartupParameters``; no transform job has one;
- volume size: the variant's ``VolumeSizeInGB`` (endpoints, components); no transform job has one;
- subnets and security groups, network isolation: the model's ``VpcConfig`` and
  ``EnableNetworkIsolation`` (and for components the endpoint configuration's too);
- KMS key: the endpoint configuration's ``KmsKeyId``, the asynchronous output's and data capture's;
  a transform job's output ``KmsKeyId`` and ``VolumeKmsKeyId``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from smtriton.aws.resources import DeployError

_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SECURITY_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}$")
_KMS_KEY = re.compile(r"^[a-zA-Z0-9:/_-]{1,2048}$")


@dataclass(frozen=True)
class Hosting:
    model_download_timeout_s: int | None = None
    volume_size_gb: int | None = None
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    network_isolation: bool = False
    kms_key: str | None = None

    def check(self, serverless: bool = False) -> None:
        """Raise DeployError for values SageMaker refuses (or, ``serverless``, options it has no place for)."""
        if self.model_download_timeout_s is not None and not 60 <= self.model_download_timeout_s <= 3600:
            raise DeployError("the model download timeout must be 60-3600 s")
        if self.volume_size_gb is not None and not 1 <= self.volume_size_gb <= 512:
            raise DeployError("the volume size must be 1-512 GB")
        if bool(self.subnets) != bool(self.security_groups):
            raise DeployError("a VPC needs both --subnet and --security-group (each repeatable)")
        for subnet in self.subnets:
            if not _SUBNET.match(subnet):
                raise DeployError(f"{subnet!r} is not a subnet id (subnet-...)")
        for group in self.security_groups:
            if not _SECURITY_GROUP.match(group):
                raise DeployError(f"{group!r} is not a security group id (sg-...)")
        if len(self.subnets) > 16 or len(self.security_groups) > 5:
            raise DeployError("a VPC takes at most 16 subnets and 5 security groups")
        if self.kms_key is not None and not _KMS_KEY.match(self.kms_key):
            raise DeployError(f"{self.kms_key!r} is not a KMS key id, ARN or alias")
        if serverless:
            given = [name for name, value in (
                ("--model-download-timeout", self.model_download_timeout_s), ("--volume-size", self.volume_size_gb),
                ("--subnet", self.subnets), ("--network-isolation", self.network_isolation),
            ) if value]  # fmt: skip
            if given:
                raise DeployError(f"serverless endpoints take no {', '.join(given)} (SageMaker has no place for it)")

    def vpc_config(self) -> dict[str, Any] | None:
        if not self.subnets:
            return None
        return {"SecurityGroupIds": list(self.security_groups), "Subnets": list(self.subnets)}

    def model_fields(self) -> dict[str, Any]:
        """What a CreateModel request takes of these: the VPC and the network isolation."""
        fields: dict[str, Any] = {}
        vpc = self.vpc_config()
        if vpc:
            fields["VpcConfig"] = vpc
        if self.network_isolation:
            fields["EnableNetworkIsolation"] = True
        return fields

    def variant_fields(self) -> dict[str, Any]:
        """What an instance-based production variant takes: the volume and the download timeout."""
        fields: dict[str, Any] = {}
        if self.volume_size_gb is not None:
            fields["VolumeSizeInGB"] = self.volume_size_gb
        if self.model_download_timeout_s is not None:
            fields["ModelDataDownloadTimeoutInSeconds"] = self.model_download_timeout_s
        return fields
