"""python -m endpoint_client transform against moto on loopback: the job it starts, the container's execution
parameters, where it refuses to read or write, and the progress it reports while waiting."""

from __future__ import annotations

import json

import pytest

from endpoint_client import transform
from endpoint_client.deployment import Aws
from loopback_servers import JsonServer, Reply
from endpoint_client.transform import S3Location, TransformPlan, ExecutionParameters, wait


def put_inputs(deployment, prefix="batch/input/run1/", names=("a.jsonl", "b.jsonl")):
    s3 = deployment.client("s3")
    line = json.dumps({"decision": {"id": "d", "state": "s", "question": "q",
                                    "options": [{"id": "x", "description": ""}, {"id": "y", "description": ""}]}})
    for name in names:
        s3.put_object(Bucket=deployment.bucket, Key=prefix + name, Body=(line + "\n") * 3)
    return f"s3://{deployment.bucket}/{prefix}"


def run(deployment, *extra, capsys):
    code = transform.main(deployment.args(*extra))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_job_runs_the_stacks_model_over_json_lines_and_reports_the_output(deployment, endpoint_stack, capsys):
    source = put_inputs(deployment)
    code, out, err = run(deployment, "--input", source, "--job-name", "decision-dev-cpu-test1", "--poll-interval",
                         "0", capsys=capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "Completed" and result["job"] == "decision-dev-cpu-test1"
    assert result["output"] == f"s3://{deployment.bucket}/batch/output/decision-dev-cpu-test1/"
    job = deployment.client("sagemaker").describe_transform_job(TransformJobName="decision-dev-cpu-test1")
    assert job["ModelName"] == endpoint_stack
    # SageMaker asks the container's /execution-parameters, which sizes batches from the speed it measured.
    assert not {"BatchStrategy", "MaxPayloadInMB", "MaxConcurrentTransforms"} & {k for k, v in job.items() if v}
    assert job["ModelClientConfig"] == {"InvocationsTimeoutInSeconds": 3600, "InvocationsMaxRetries": 1}
    # The container runs as a transform (its deadline and budget are the mini-batch's), with the same budget.
    assert job["Environment"] == {"ADAPTER_DEPLOYMENT": "transform", "ADAPTER_BATCH_TIMEOUT_S": "3600"}
    assert job["TransformInput"] == {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": source}},
                                     "ContentType": "application/jsonlines", "SplitType": "Line",
                                     "CompressionType": "None"}
    assert job["TransformOutput"] == {"S3OutputPath": result["output"], "Accept": "application/jsonlines",
                                      "AssembleWith": "Line"}
    assert job["TransformResources"] == {"InstanceType": "ml.c7i.xlarge", "InstanceCount": 1}
    assert ("2 input files, batches as the container's /execution-parameters says, 3600 s per request, "
            "1 x ml.c7i.xlarge") in err
    assert "Completed: 0/2 input files done" in err and f"results in {result['output']}" in err
    groups = deployment.client("logs").describe_log_groups(logGroupNamePrefix="/aws/sagemaker/TransformJobs")
    assert [g["logGroupName"] for g in groups["logGroups"]] == ["/aws/sagemaker/TransformJobs"]


@pytest.mark.parametrize("owner, expected", [
    (True, "deploy decision-dev-artifacts, which creates it"),
    (False, "environments.dev.create_transform_log_group is false: deploy the artifacts stack of the environment"),
])
def test_without_the_transform_log_group_no_job_starts(deployment, endpoint_stack, capsys, owner, expected):
    """The artifacts stack owns /aws/sagemaker/TransformJobs (retention, the logs key); the command never creates it,
    which would leave a group without either and make that stack's deploy fail."""
    deployment.write_cdk_json(lambda e: e.__setitem__("create_transform_log_group", owner))
    deployment.client("logs").delete_log_group(logGroupName="/aws/sagemaker/TransformJobs")
    source = put_inputs(deployment)
    code, out, err = run(deployment, "--input", source, "--job-name", "decision-dev-cpu-nologs", capsys=capsys)
    assert code == 1 and out == ""
    assert "the log group /aws/sagemaker/TransformJobs does not exist (" + expected in err
    assert deployment.client("logs").describe_log_groups(
        logGroupNamePrefix="/aws/sagemaker/TransformJobs")["logGroups"] == []
    jobs = deployment.client("sagemaker").list_transform_jobs()["TransformJobSummaries"]
    assert "decision-dev-cpu-nologs" not in [job["TransformJobName"] for job in jobs]


@pytest.fixture
def container():
    """A loopback stand-in for the container's GET /execution-parameters; the test sets ``answer[0]``."""
    answer: list[dict] = [{}]
    respond = lambda request: Reply(200, answer[0]) if request.path == "/execution-parameters" else Reply(404, {})  # noqa: E731
    with JsonServer(respond) as server:
        yield answer, f"{server.url}/execution-parameters"


@pytest.mark.parametrize("answer, expected", [
    ({"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 2}, ("MultiRecord", 2, 1)),
    ({"MaxConcurrentTransforms": 1, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 6}, ("SingleRecord", 6, 1)),
])
def test_the_containers_execution_parameters_are_used(deployment, endpoint_stack, container, capsys, answer,
                                                      expected):
    answered, url = container
    answered[0] = answer
    code, out, err = run(deployment, "--input", put_inputs(deployment), "--job-name", "decision-dev-cpu-test2",
                         "--execution-parameters", url, "--no-wait", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["status"] == "InProgress"
    job = deployment.client("sagemaker").describe_transform_job(TransformJobName="decision-dev-cpu-test2")
    assert (job["BatchStrategy"], job["MaxPayloadInMB"], job["MaxConcurrentTransforms"]) == expected


def test_each_request_gets_the_budget_the_models_container_works_to(deployment, endpoint_stack, capsys):
    sagemaker = deployment.client("sagemaker")
    model = sagemaker.describe_model(ModelName=endpoint_stack)
    sagemaker.delete_model(ModelName=endpoint_stack)
    sagemaker.create_model(ModelName=endpoint_stack, ExecutionRoleArn=model["ExecutionRoleArn"],
                           PrimaryContainer={**model["PrimaryContainer"],
                                             "Environment": {"ADAPTER_BATCH_TIMEOUT_S": "1200"}})
    code, _, err = run(deployment, "--input", put_inputs(deployment), "--job-name", "decision-dev-cpu-test3",
                       "--no-wait", capsys=capsys)
    assert code == 0, err
    job = sagemaker.describe_transform_job(TransformJobName="decision-dev-cpu-test3")
    assert job["ModelClientConfig"] == {"InvocationsTimeoutInSeconds": 1200, "InvocationsMaxRetries": 1}
    assert job["Environment"] == {"ADAPTER_DEPLOYMENT": "transform", "ADAPTER_BATCH_TIMEOUT_S": "1200"}


@pytest.mark.parametrize("answer, extra, message", [
    ({"MaxConcurrentTransforms": 1, "BatchStrategy": "ALL_AT_ONCE", "MaxPayloadInMB": 6}, [],
     "answers BatchStrategy 'ALL_AT_ONCE', not one of MULTI_RECORD, SINGLE_RECORD"),
    ({"BatchStrategy": "MULTI_RECORD"}, [], "answers no MaxPayloadInMB"),
    ({"BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}, ["--max-payload-mb", "10"],
     "--max-payload-mb 10 is above the container's 6"),
])
def test_execution_parameters_the_runner_cannot_honour_stop_it(deployment, endpoint_stack, container, capsys,
                                                               answer, extra, message):
    answered, url = container
    answered[0] = answer
    code, _, err = run(deployment, "--input", put_inputs(deployment), "--execution-parameters", url, *extra,
                       capsys=capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize("location, message", [
    ("--input=s3://elsewhere/batch/input/x/", "the input must be under s3://{bucket}/batch/input/"),
    ("--input=s3://{bucket}/models/", "the input must be under s3://{bucket}/batch/input/"),
    ("--output=s3://{bucket}/models/out/", "the output must be under s3://{bucket}/batch/output/"),
    ("--input=s3://{bucket}/batch/input/empty/", "no input objects under s3://{bucket}/batch/input/empty/"),
    ("--input=batch/input/", "'batch/input/' is not an S3 URI"),
])
def test_locations_the_execution_role_cannot_use_are_refused(deployment, endpoint_stack, capsys, location, message):
    source = put_inputs(deployment)
    extra = [location.format(bucket=deployment.bucket)]
    if not location.startswith("--input"):
        extra.append(f"--input={source}")
    code, _, err = run(deployment, *extra, capsys=capsys)
    assert code == 2 and message.format(bucket=deployment.bucket) in err


def test_an_endpoint_stack_that_is_not_deployed_is_named(deployment, capsys):
    code, _, err = run(deployment, "--input", put_inputs(deployment), capsys=capsys)
    assert code == 1 and "stack decision-dev-endpoint-cpu is not deployed" in err


def test_the_gpu_model_is_refused_before_any_job_is_created(deployment, endpoint_stack, capsys):
    """Transform hosts' NVIDIA drivers (TransformAmiVersion: 470, 535) cannot run the GPU image's CUDA 13."""
    code, out, err = run(deployment, "--endpoint", "gpu", "--input", put_inputs(deployment), capsys=capsys)
    assert code == 2 and out == ""
    assert ("--endpoint gpu: the GPU model does not run in Batch Transform: transform hosts offer NVIDIA drivers "
            "470, 535 (TransformAmiVersion), and the GPU image is built with CUDA 13.0, which needs driver 580 or "
            "later") in err
    jobs = deployment.client("sagemaker").list_transform_jobs()["TransformJobSummaries"]
    assert not [job for job in jobs if job["TransformJobName"].startswith("decision-dev-gpu")]


class Progressing:
    """SageMaker as a job runs: InProgress for the first polls, then the final status; moto holds the job."""

    def __init__(self, client, statuses):
        self._client, self._statuses = client, list(statuses)

    def describe_transform_job(self, **kwargs):
        description = self._client.describe_transform_job(**kwargs)
        status = self._statuses.pop(0)
        return {**description, "TransformJobStatus": status,
                "FailureReason": "ClientError: see the job's logs" if status == "Failed" else ""}

    def __getattr__(self, name):
        return getattr(self._client, name)


def started_job(deployment, endpoint_stack, name):
    source = put_inputs(deployment, names=("a.jsonl", "sub/b.jsonl"))
    job = TransformPlan(job_name=name, model_name=endpoint_stack, input=S3Location.parse(source),
                        output=S3Location(deployment.bucket, f"batch/output/{name}/"),
                        input_keys=("batch/input/run1/a.jsonl", "batch/input/run1/sub/b.jsonl"),
                        instance_type="ml.c7i.xlarge", instance_count=1,
                        parameters=ExecutionParameters("MultiRecord", 6, None))
    deployment.client("sagemaker").create_transform_job(**job.request({}))
    return job


@pytest.mark.parametrize("final", ["Completed", "Failed"])
def test_waiting_reports_status_and_finished_input_files(deployment, endpoint_stack, final):
    job = started_job(deployment, endpoint_stack, f"decision-dev-cpu-{final.lower()}")
    import boto3
    session = boto3.session.Session(region_name="us-east-1")
    sagemaker = Progressing(session.client("sagemaker", endpoint_url=deployment.url),
                            ["InProgress", "InProgress", "InProgress", final])
    aws = Aws(session=session, endpoint_url=deployment.url)
    aws.client = lambda service: sagemaker if service == "sagemaker" else session.client(
        service, endpoint_url=deployment.url)
    s3 = deployment.client("s3")
    outputs = iter(["a.jsonl.out", "sub/b.jsonl.out"])

    def sleep(seconds):
        # Between polls SageMaker writes one input file's results (the runner must map sub/ paths too).
        name = next(outputs, None)
        if name:
            s3.put_object(Bucket=deployment.bucket, Key=job.output.key + name, Body=b"{}\n{}\n{}\n")

    reported = []
    ticks = iter(range(0, 1000, 75))
    description = wait(aws, job, poll_s=30, report=reported.append, sleep=sleep, clock=lambda: next(ticks))
    assert description["TransformJobStatus"] == final and description["OutputsDone"] == 2
    assert [line.split(" ", 2)[2] for line in reported] == [
        "InProgress: 0/2 input files done", "InProgress: 1/2 input files done", "InProgress: 2/2 input files done",
        f"{final}: 2/2 input files done"]
    assert reported[0].startswith(f"[01:15] {job.job_name} ")
