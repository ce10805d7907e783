"""The artifacts stack: bucket and repository settings, and what cdk destroy does with them per environment."""

from __future__ import annotations

import json

from aws_cdk.assertions import Match

from cdk_testkit import flatten


def buckets(synth):
    found = synth.resources("artifacts", "AWS::S3::Bucket")
    artifact = [r for lid, r in found.items() if lid.startswith("ArtifactBucket")]
    access_logs = [r for lid, r in found.items() if lid.startswith("AccessLogBucket")]
    assert len(found) == 2 and len(artifact) == 1 and len(access_logs) == 1
    return artifact[0], access_logs[0]


def test_both_buckets_are_encrypted_private_and_tls_only(pinned):
    template = pinned.assertions("artifacts")
    for bucket in buckets(pinned):
        properties = bucket["Properties"]
        assert properties["BucketEncryption"] == {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
        assert properties["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True}
        assert properties["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    # enforce_ssl: a Deny on aws:SecureTransport false in each bucket's policy.
    template.resource_properties_count_is("AWS::S3::BucketPolicy", {
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}}, 2)


def test_the_artifact_bucket_is_versioned_logged_and_has_lifecycle_rules(pinned):
    artifact, access_logs = buckets(pinned)
    properties = artifact["Properties"]
    assert properties["VersioningConfiguration"] == {"Status": "Enabled"}
    assert properties["LoggingConfiguration"]["LogFilePrefix"] == "artifact-bucket/"
    assert flatten(properties["LoggingConfiguration"]["DestinationBucketName"]).startswith("<AccessLogBucket")
    rules = {rule["Id"]: rule for rule in properties["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    expected_days = {"dev": 30, "prod": 365}[pinned.env]
    assert rules["expire-noncurrent-versions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": expected_days}
    assert rules["expire-noncurrent-versions"]["ExpiredObjectDeleteMarker"] is True
    log_rules = access_logs["Properties"]["LifecycleConfiguration"]["Rules"]
    assert log_rules[0]["ExpirationInDays"] == {"dev": 30, "prod": 365}[pinned.env]


def test_the_repository_is_immutable_scanned_and_lifecycled(pinned):
    repository = pinned.resource("artifacts", "AWS::ECR::Repository", "ImageRepository")
    properties = repository["Properties"]
    assert properties["ImageTagMutability"] == "IMMUTABLE"
    assert properties["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert "RepositoryName" not in properties  # generated: CloudFormation may replace it
    policy = json.loads(properties["LifecyclePolicy"]["LifecyclePolicyText"])
    kept = {"dev": 20, "prod": 50}[pinned.env]
    assert [(r["rulePriority"], r["selection"]["tagPrefixList"], r["selection"]["countNumber"])
            for r in policy["rules"]] == [
        (1, ["pinned-"], 9999), (2, ["cpu-"], kept), (3, ["gpu-"], kept), (4, ["textgen-"], kept)]
    assert all(r["selection"]["tagStatus"] == "tagged" for r in policy["rules"])


def test_pinned_images_cannot_be_expired_by_the_per_kind_rules(pinned):
    """ECR applies the rules by priority, and a rule cannot expire an image that a higher-priority rule selects:
    an image tagged pinned-<digest> (check-pins --protect) is selected by rule 1, which keeps 9999 of them."""
    from endpoint_client.pins import protective_tag
    repository = pinned.resource("artifacts", "AWS::ECR::Repository", "ImageRepository")
    rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    first = min(rules, key=lambda rule: rule["rulePriority"])
    tag = protective_tag("sha256:" + "ab" * 32)
    assert tag.startswith(tuple(first["selection"]["tagPrefixList"])) and len(tag) <= 128
    assert first["selection"]["countType"] == "imageCountMoreThan" and first["action"] == {"type": "expire"}
    assert not any(tag.startswith(prefix) for rule in rules if rule is not first
                   for prefix in rule["selection"]["tagPrefixList"])


def test_no_fixed_bucket_names(pinned):
    for bucket in buckets(pinned):
        assert "BucketName" not in bucket["Properties"]


def test_dev_destroy_removes_buckets_and_repository(dev):
    template = dev.template("artifacts")
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] in ("AWS::S3::Bucket", "AWS::ECR::Repository"):
            assert resource["DeletionPolicy"] == "Delete", logical_id
            assert resource["UpdateReplacePolicy"] == "Delete", logical_id
    assert dev.resource("artifacts", "AWS::ECR::Repository", "ImageRepository")["Properties"]["EmptyOnDelete"]
    # CDK's auto-delete custom resource empties each bucket before CloudFormation deletes it.
    assert len(dev.resources("artifacts", "Custom::S3AutoDeleteObjects")) == 2


def test_prod_destroy_keeps_buckets_and_repository(prod):
    template = prod.template("artifacts")
    kept = [resource for resource in template["Resources"].values()
            if resource["Type"] in ("AWS::S3::Bucket", "AWS::ECR::Repository")]
    assert len(kept) == 3
    for resource in kept:
        assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert not prod.resource("artifacts", "AWS::ECR::Repository", "ImageRepository")["Properties"].get("EmptyOnDelete")
    assert prod.resources("artifacts", "Custom::S3AutoDeleteObjects") == {}


def test_the_bucket_arn_is_exported_under_a_readable_name(pinned):
    outputs = pinned.template("artifacts")["Outputs"]
    exports = {output["Export"]["Name"] for output in outputs.values() if "Export" in output}
    assert f"{pinned.prefix}-artifacts:ArtifactBucketArn" in exports
