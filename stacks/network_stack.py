"""The network stack (``<prefix>-network``), only where cdk.json's ``vpc.create_endpoints`` asks for it: the VPC
endpoints that endpoints placed in subnets without internet access need.

- an interface endpoint (AWS PrivateLink, private DNS on) per service of ``INTERFACE_ENDPOINT_SERVICES``: ECR's API
  and registry (the image pull), CloudWatch Logs and STS, each in the environment's subnets (one network interface
  per subnet, so one subnet per Availability Zone), behind a security group of their own that admits HTTPS (443)
  from the environment's security groups only;
- S3's gateway endpoint on the subnets' route tables (the model archive, the image's layers, which ECR serves from
  S3, and Batch Transform's input and output).

Interface endpoints are billed per hour and Availability Zone, and per GB processed; the gateway endpoint is free
(docs/deploy.md, "VPC"). Every endpoint stack depends on this one, so the endpoints exist before a Model is created
and are deleted after the last one. It exports nothing.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.config import INTERFACE_ENDPOINT_SERVICES, EnvironmentConfig

HTTPS = 443


class NetworkStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        vpc, created = config.vpc, config.vpc.create_endpoints
        prefix = config.name_prefix
        self.security_group = ec2.CfnSecurityGroup(
            self, "InterfaceEndpoints", vpc_id=created.vpc_id,
            group_description=f"{prefix}: HTTPS to the VPC interface endpoints from the endpoints security groups (vpc.security_group_ids)",
            security_group_ingress=[ec2.CfnSecurityGroup.IngressProperty(
                ip_protocol="tcp", from_port=HTTPS, to_port=HTTPS, source_security_group_id=group,
                description=f"HTTPS from {group} (vpc.security_group_ids)") for group in vpc.security_group_ids],
            # The endpoints answer; they open no connection of their own.
            security_group_egress=[ec2.CfnSecurityGroup.EgressProperty(
                ip_protocol="icmp", from_port=252, to_port=86, cidr_ip="255.255.255.255/32",
                description="no egress (a rule that matches no traffic replaces the default allow-all)")])
        self.interface_endpoints = {
            service: ec2.CfnVPCEndpoint(
                self, "Interface" + "".join(part.capitalize() for part in service.split(".")),
                vpc_id=created.vpc_id, vpc_endpoint_type="Interface",
                service_name=f"com.amazonaws.{self.region}.{service}", subnet_ids=list(vpc.subnet_ids),
                security_group_ids=[self.security_group.attr_group_id], private_dns_enabled=True)
            for service in INTERFACE_ENDPOINT_SERVICES}
        self.s3_gateway = ec2.CfnVPCEndpoint(
            self, "GatewayS3", vpc_id=created.vpc_id, vpc_endpoint_type="Gateway",
            service_name=f"com.amazonaws.{self.region}.s3", route_table_ids=list(created.route_table_ids))
