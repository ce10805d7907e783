"""stacks/config.py: cdk.json's environments parse into frozen configs; every bad value is named by its key."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

import app as cdk_app
from cdk_testkit import TEST_PINS, cdk_json_context, context_for
from deploy import pins as test_pins
from stacks.config import ConfigError, EcrRepositoryRef, ImagePin, load_environment

DLC_DIGEST = "sha256:1f19c220f5f169228f20cdddca00f4838be22a3a1ce9002bc444006adc3d6d43"


def parse(env: str = "prod", edit=None, pinned: bool = True, **defaults):
    context = context_for(env, pinned=pinned, edit=edit)
    return load_environment(context["environments"], env, model_pins=cdk_app.model_pin_names(), **defaults)


def setting(path: str, value):
    """An edit that sets the dotted path inside the environment (list indexes as numbers)."""
    def edit(environment):
        *parents, last = path.split(".")
        node = environment
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


def removing(path: str):
    def edit(environment):
        *parents, last = path.split(".")
        node = environment
        for part in parents:
            node = node[part]
        del node[last]
    return edit


@pytest.mark.parametrize("env", ["dev", "prod"])
@pytest.mark.parametrize("pinned", [False, True])
def test_shipped_environments_parse(env, pinned):
    config = parse(env, pinned=pinned)
    assert config.name == env
    # Both list the asynchronous endpoint: dev scales it to zero when idle, prod keeps one instance.
    assert config.endpoints == ("cpu", "gpu", "text_generation", "async")
    assert config.async_.min_instance_count == (0 if env == "dev" else 1)
    assert config.artifacts.retain is (env == "prod")
    assert 1 <= len(config.gpu.instance_pools) <= 5
    assert (config.pins.model is not None) is pinned


def test_fresh_clone_has_no_pins_and_names_what_to_set():
    config = parse("dev", pinned=False)
    assert config.pins.images.cpu is None and config.pins.model is None
    from stacks.endpoint_specs import endpoint_specs
    gpu = [spec for spec in endpoint_specs(config) if spec.kind == "gpu"][0]
    assert gpu.missing_pins == ("environments.dev.pins.images.gpu", "environments.dev.pins.model")
    assert not gpu.deployable


def test_config_is_frozen():
    config = parse()
    with pytest.raises(ValidationError, match="frozen"):
        config.name_prefix = "other"
    assert isinstance(config.gpu.instance_pools, tuple)


def test_gpu_pools_keep_their_order():
    def edit(environment):
        environment["gpu"]["instance_pools"] = ["ml.g5.xlarge", "ml.g4dn.xlarge", "ml.g6.xlarge"]
        environment["gpu"]["target_invocations_per_instance"].pop("ml.g6e.xlarge")
    config = parse(edit=edit)
    assert config.gpu.instance_pools == ("ml.g5.xlarge", "ml.g4dn.xlarge", "ml.g6.xlarge")


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_both_environments_default_to_the_walkthrough_pool_order(env):
    assert parse(env).gpu.instance_pools == ("ml.g6e.xlarge", "ml.g6.xlarge", "ml.g5.xlarge", "ml.g4dn.xlarge")


def test_monitoring_and_termination_protection():
    assert parse("prod").termination_protection is True and parse("dev").termination_protection is False
    assert parse("dev").monitoring.alarm_emails == ()
    config = parse("dev", edit=setting("monitoring", {"alarm_emails": ["oncall@example.com"]}))
    assert config.monitoring.alarm_emails == ("oncall@example.com",)
    without = parse("dev", edit=lambda e: (e.pop("monitoring"), e.pop("termination_protection")))
    assert without.monitoring.alarm_emails == () and without.termination_protection is False


def test_digest_pins_resolve_against_the_project_repository():
    config = parse("dev")
    assert config.pins.images.cpu == ImagePin(digest=TEST_PINS["images"]["cpu"], repository=None)


def test_a_private_ecr_uri_pinned_by_digest_names_its_repository():
    uri = f"763104351884.dkr.ecr.eu-west-1.amazonaws.com/llama-cpp@{DLC_DIGEST}"
    config = parse("dev", edit=lambda e: (located("111122223333")(e), setting("pins.images.text_generation", uri)(e)))
    assert config.pins.images.text_generation == ImagePin(digest=DLC_DIGEST, repository=EcrRepositoryRef(
        account="763104351884", region="eu-west-1", name="llama-cpp", partition="aws"))
    assert config.pins.images.text_generation.repository.arn == \
        "arn:aws:ecr:eu-west-1:763104351884:repository/llama-cpp"


def test_prod_deploys_only_where_cdk_json_says():
    """Termination protection and retained artifacts: account and region must be named, not the caller's."""
    with pytest.raises(ConfigError) as error:
        parse("prod", edit=lambda e: (e.pop("account"), e.pop("region")), default_account="123456789012",
              default_region="us-east-1")
    assert [problem.split(":")[0] for problem in error.value.problems] == [
        "environments.prod.account", "environments.prod.region"]
    assert "is required because termination_protection is true and artifacts.removal_policy is retain" \
        in error.value.problems[0]
    # (dev, the artifact source, is in the caller's region: prod builds its own to be elsewhere.)
    config = parse("prod", pinned=False, edit=lambda e: (setting("region", "eu-central-1")(e), building_its_own(e)),
                   default_region="us-east-1")
    assert (config.account, config.region) == ("111122223333", "eu-central-1")


@pytest.mark.parametrize("edit, reason", [
    (setting("termination_protection", True), "termination_protection is true"),
    (setting("artifacts.removal_policy", "retain"), "artifacts.removal_policy is retain"),
])
def test_either_protection_requires_a_location(edit, reason):
    with pytest.raises(ConfigError) as error:
        parse("dev", edit=edit, default_account="123456789012", default_region="us-east-1")
    assert error.value.problems == tuple(
        f"environments.dev.{key}: is required because {reason}: this environment deploys only to the {key} named "
        f"here, not to the caller's (set {example})" for key, example in (
            ("account", "the 12-digit account id"), ("region", 'e.g. "eu-west-1"')))


def test_account_and_region_default_to_the_cli_environment():
    config = parse("dev", default_account="111122223333", default_region="eu-central-1")
    assert (config.account, config.region) == ("111122223333", "eu-central-1")
    pinned_region = parse("dev", edit=setting("region", "us-west-2"), default_region="eu-central-1")
    assert pinned_region.region == "us-west-2"


SIX_POOLS = ["ml.g6.xlarge", "ml.g6.2xlarge", "ml.g5.xlarge", "ml.g5.2xlarge", "ml.g4dn.xlarge", "ml.g6e.xlarge"]
TAGGED = "123456789012.dkr.ecr.us-east-1.amazonaws.com/decision-images"


@pytest.mark.parametrize("edit, expected", [
    (setting("gpu.instance_pools", SIX_POOLS),
     "environments.prod.gpu.instance_pools: expected a list of 1 to 5 instance types in priority order"),
    (setting("gpu.instance_pools", []),
     "environments.prod.gpu.instance_pools: expected a list of 1 to 5 instance types in priority order"),
    (setting("gpu.instance_pools", ["ml.g6.xlarge", "ml.g5.xlarge", "ml.p3.2xlarge"]),
     "environments.prod.gpu.instance_pools[2]: 'ml.p3.2xlarge' has an NVIDIA V100 (sm_70), which the GPU image "
     "is not compiled for"),
    (setting("gpu.instance_pools", ["ml.g6.xlarge", "ml.g6.xlarge"]),
     "environments.prod.gpu.instance_pools[1]: 'ml.g6.xlarge' is already pool 1"),
    (setting("gpu.instance_pools", ["ml.c7i.xlarge"]),
     "environments.prod.gpu.instance_pools[0]: 'ml.c7i.xlarge' is not an NVIDIA GPU instance family"),
    (setting("gpu.instance_pools", ["g6.xlarge"]),
     "environments.prod.gpu.instance_pools[0]: 'g6.xlarge' is not an ML instance type"),
    (setting("gpu.provision_timeout_s", 299), "environments.prod.gpu.provision_timeout_s: 299 is outside 300..3600"),
    (setting("gpu.provision_timeout_s", 3601), "environments.prod.gpu.provision_timeout_s: 3601 is outside 300..3600"),
    (setting("gpu.provision_timeout_s", "900"),
     "environments.prod.gpu.provision_timeout_s: expected an integer from 300 to 3600, got a string"),
    (setting("gpu.inference_ami_version", "al2-ami-sagemaker-inference-neuron-2"),
     "environments.prod.gpu.inference_ami_version: 'al2-ami-sagemaker-inference-neuron-2' is not one of"),
    (setting("gpu.inference_ami_version", "al2-ami-sagemaker-inference-gpu-3-1"),
     "environments.prod.gpu.inference_ami_version: 'al2-ami-sagemaker-inference-gpu-3-1' has NVIDIA driver 550 "
     "(CUDA 12.4), older than the CUDA 13.0 the GPU image is built with"),
    (setting("pins.images.cpu", f"{TAGGED}:latest"),
     f"environments.prod.pins.images.cpu: '{TAGGED}:latest' is pinned by the mutable tag ':latest'; pin the "
     "digest instead"),
    (setting("pins.images.gpu", f"{TAGGED}:v1"),
     f"environments.prod.pins.images.gpu: '{TAGGED}:v1' is pinned by the mutable tag ':v1'"),
    (setting("pins.images.gpu", "v1"), "environments.prod.pins.images.gpu: 'v1' is pinned without a digest"),
    (setting("pins.images.cpu", "sha256:abc"), "environments.prod.pins.images.cpu: 'sha256:abc' has a malformed "
                                               "digest"),
    (setting("pins.images.cpu", f"{TAGGED}@sha256:" + "A" * 64), "environments.prod.pins.images.cpu: "
                                                                 f"'{TAGGED}@sha256:" + "A" * 64 + "' has a malformed"),
    (setting("pins.images.cpu", "ghcr.io/ggml-org/llama.cpp@sha256:" + "1" * 64),
     "environments.prod.pins.images.cpu: 'ghcr.io/ggml-org/llama.cpp@sha256:" + "1" * 64 + "' is not in a private "
     "Amazon ECR registry"),
    (setting("pins.images.text_generation", f"public.ecr.aws/deep-learning-containers/llama-cpp@{DLC_DIGEST}"),
     "environments.prod.pins.images.text_generation: 'public.ecr.aws/deep-learning-containers/llama-cpp@sha256:"
     "1f19c220f5f169228f20cdddca00f4838be22a3a1ce9002bc444006adc3d6d43' is not in a private Amazon ECR registry"),
    (setting("pins.model.gguf_sha256", "5" * 64),
     "environments.prod.pins.model.s3_key: the key's GGUF sha256 (13c16f426047...) differs from "
     "environments.prod.pins.model.gguf_sha256 (555555555555...)"),
    (setting("pins.model.s3_key", "models/model.tar.gz"),
     "environments.prod.pins.model.s3_key: 'models/model.tar.gz' is not a key of the form "
     "models/<pin>/<gguf sha256>/model.tar.gz"),
    (removing("pins.model.gguf_sha256"), "environments.prod.pins.model.gguf_sha256: is required"),
    (setting("cpu.threads", 5), "environments.prod.cpu.threads: 5 threads exceed the 4 physical cores of "
                                "ml.c7i.2xlarge (8 vCPUs): llama.cpp runs one thread per core"),
    (setting("text_generation.threads", 16), "environments.prod.text_generation.threads: 16 threads exceed the 8 "
                                             "physical cores of ml.c7i.4xlarge (16 vCPUs)"),
    (setting("cpu.instance_type", "ml.c7g.2xlarge"),
     "environments.prod.cpu.instance_type: 'ml.c7g.2xlarge' is a Graviton (arm64) instance; the CPU adapter image "
     "is built for x86-64"),
    (setting("text_generation.instance_type", "ml.g5.xlarge"),
     "environments.prod.text_generation.instance_type: 'ml.g5.xlarge' is an accelerated instance"),
    (setting("cpu.initial_instance_count", 7),
     "environments.prod.cpu.initial_instance_count: 7 is above max_instance_count (6)"),
    (setting("cpu.startup_health_check_timeout_s", 59),
     "environments.prod.cpu.startup_health_check_timeout_s: 59 is outside 60..3600"),
    (setting("endpoints", ["cpu", "tpu"]), "environments.prod.endpoints[1]: 'tpu' is not one of cpu, gpu, "
                                           "text_generation"),
    (setting("endpoints", ["cpu", "cpu"]), "environments.prod.endpoints[1]: 'cpu' is listed twice"),
    (setting("name_prefix", "Decision_Prod"), "environments.prod.name_prefix: 'Decision_Prod' is not 3 to 24"),
    (setting("account", "12345"), "environments.prod.account: '12345' is not a 12-digit AWS account id"),
    (setting("region", "mars-1"), "environments.prod.region: 'mars-1' is not an AWS region name"),
    (setting("artifacts.removal_policy", "delete"),
     "environments.prod.artifacts.removal_policy: 'delete' is not one of destroy, retain"),
    (setting("cpu.instnace_type", "ml.c7i.xlarge"),
     "environments.prod.cpu.instnace_type: unknown key (expected one of: instance_type, threads"),
    (setting("gpu_pools", []), "environments.prod.gpu_pools: unknown key"),
    (removing("text_generation"), "environments.prod.text_generation: is required"),
    (setting("gpu.target_invocations_per_instance", 200),
     "environments.prod.gpu.target_invocations_per_instance: expected an object mapping each instance type"),
    (lambda e: e["gpu"]["target_invocations_per_instance"].pop("ml.g4dn.xlarge"),
     "environments.prod.gpu.target_invocations_per_instance: has no target for ml.g4dn.xlarge (every instance "
     "type the endpoint runs on needs one)"),
    (setting("cpu.target_invocations_per_instance", {"ml.c7i.2xlarge": 50, "ml.c7i.xlarge": 30}),
     "environments.prod.cpu.target_invocations_per_instance['ml.c7i.xlarge']: is not an instance type of this "
     "endpoint (ml.c7i.2xlarge)"),
    (setting("cpu.target_invocations_per_instance", {"ml.c7i.2xlarge": 0}),
     "environments.prod.cpu.target_invocations_per_instance['ml.c7i.2xlarge']: 0 is outside 1..100000"),
    (setting("cpu.model_latency_p99_ms", {"ml.c7i.2xlarge": 45000}),
     "environments.prod.cpu.model_latency_p99_ms: unknown key"),
    (setting("monitoring", {"alarm_emails": ["oncall"]}),
     "environments.prod.monitoring.alarm_emails[0]: 'oncall' is not an email address"),
    (setting("monitoring", {"alarm_email": []}), "environments.prod.monitoring.alarm_email: unknown key (expected "
                                                 "one of: alarm_emails)"),
    (setting("termination_protection", "yes"),
     "environments.prod.termination_protection: expected true or false, got a string ('yes')"),
    (setting("cpu", "ml.c7i.xlarge"), "environments.prod.cpu: expected an object, got a string"),
], ids=lambda value: value if isinstance(value, str) and len(value) < 60 else None)
def test_invalid_values_are_named_by_key_path(edit, expected):
    with pytest.raises(ConfigError) as error:
        parse("prod", edit=edit)
    assert expected in str(error.value), str(error.value)


@pytest.mark.parametrize("edit, expected", [
    (setting("build.model_pin", "llama-70b"),
     "environments.dev.build.model_pin: 'llama-70b' is not a pin in model_build/pins.json (qwen3.5-4b)"),
    (setting("build.text_generation_source_image", "public.ecr.aws/deep-learning-containers/llama-cpp:latest"),
     "environments.dev.build.text_generation_source_image: expected an image reference pinned by digest"),
    (setting("build.log_retention_days", 10), "environments.dev.build.log_retention_days: 10 is not a CloudWatch "
                                              "Logs retention"),
], ids=["model-pin", "source-image", "log-retention"])
def test_invalid_build_settings_are_named_by_key_path(edit, expected):
    with pytest.raises(ConfigError) as error:
        parse("dev", edit=edit)
    assert expected in str(error.value), str(error.value)


def test_every_problem_is_reported_at_once():
    def edit(environment):
        environment["gpu"]["provision_timeout_s"] = 10
        environment["pins"]["images"]["cpu"] = "decision:latest"
        environment["surprise"] = True
    with pytest.raises(ConfigError) as error:
        parse("dev", edit=edit)
    assert [problem.split(":")[0] for problem in error.value.problems] == [
        "environments.dev.gpu.provision_timeout_s", "environments.dev.pins.images.cpu", "environments.dev.surprise"]


@pytest.mark.parametrize("env_name, expected", [
    (None, "env: choose an environment with -c env=NAME (one of: dev, prod)"),
    ("staging", "env: 'staging' is not an environment in cdk.json (one of: dev, prod)"),
])
def test_the_environment_must_be_chosen(env_name, expected):
    context = context_for("dev")
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_environment(context["environments"], env_name, model_pins=cdk_app.model_pin_names())


# --- issue 33, item 5: resources an account has once; pins from another region; the bootstrap's key ----------

OTHER_ACCOUNT = "444455556666"
PROVIDER = "arn:aws:iam::111122223333:oidc-provider/token.actions.githubusercontent.com"
BOOTSTRAP_KEY = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def both(env_edits):
    """cdk.json's context (both environments given a repository, nothing pinned: a pinned prod would make dev retain
    its artifacts and name its location) with edits per environment name."""
    context = context_for("prod", pinned=False)
    environments = context["environments"]
    for name, environment in environments.items():
        environment["review"]["github_repository"] = "example-org/decision-models"
        for edit in env_edits.get(name, ()):
            edit(environment)
    return environments


def building_its_own(environment):
    """prod as it was before promotion: its own build section (dev's), no artifacts_from."""
    environment.pop("artifacts_from", None)
    environment["build"] = {**cdk_json_context()["environments"]["dev"]["build"], "log_retention_days": 90}


def located(account, region="eu-west-1"):
    def edit(environment):
        environment.update(account=account, region=region)
    edit.region = region
    return edit


@pytest.mark.parametrize("env", ["dev", "prod"])
@pytest.mark.parametrize("key, dev_edits, expected", [
    ("review.create_oidc_provider", [located("111122223333")],
     "is true here and in environments.{other}.review.create_oidc_provider, in the same account 111122223333; an "
     "account has one IAM OIDC provider"),
    ("create_transform_log_group", [located("111122223333"), setting("review.create_oidc_provider", False)],
     "is true here and in environments.{other}.create_transform_log_group, in the same account 111122223333 region "
     "eu-west-1; an account and region have one /aws/sagemaker/TransformJobs log group"),
])
def test_two_environments_of_one_account_may_not_both_create_its_singletons(env, key, dev_edits, expected):
    environments = both({"dev": [*dev_edits, setting(key, True)], "prod": [setting(key, True)]})
    other = "prod" if env == "dev" else "dev"
    with pytest.raises(ConfigError) as error:
        load_environment(environments, env, model_pins=cdk_app.model_pin_names())
    assert f"environments.{env}.{key}: " + expected.format(other=other) in str(error.value), str(error.value)


@pytest.mark.parametrize("dev_edits", [
    [located(OTHER_ACCOUNT)],                                                       # another account
    [located("111122223333", "us-east-1"), setting("review.create_oidc_provider", False)],  # another region
    [located("111122223333"), setting("review.create_oidc_provider", False),
     setting("create_transform_log_group", False)],                                 # dev uses prod's
    [located("111122223333"), setting("review.create_oidc_provider", False), setting("review.oidc_provider_arn",
     PROVIDER), setting("create_transform_log_group", False)],                     # ... named by its ARN
    [],                                                                             # dev's account unknown
], ids=["other-account", "other-region", "one-creates", "arn-named", "unknown-account"])
def test_one_creator_per_account_is_accepted(dev_edits):
    # prod builds its own where dev is in another region (artifacts_from requires one region).
    other_region = any(getattr(edit, "region", None) not in (None, "eu-west-1") for edit in dev_edits)
    environments = both({"dev": dev_edits, "prod": [building_its_own] if other_region else []})
    for env in ("dev", "prod"):
        load_environment(environments, env, model_pins=cdk_app.model_pin_names())


def test_a_null_account_is_the_callers():
    """dev without an account deploys to the caller's: the same account as prod's, there."""
    key = "review.create_oidc_provider"
    environments = both({"dev": [setting(key, True)], "prod": [setting(key, True)]})
    with pytest.raises(ConfigError, match="environments.dev.review.create_oidc_provider: is true here"):
        load_environment(environments, "dev", model_pins=cdk_app.model_pin_names(), default_account="111122223333",
                         default_region="eu-west-1")


def creates(environments, env, **defaults):
    config = load_environment(environments, env, model_pins=cdk_app.model_pin_names(), **defaults)
    return config.review.create_oidc_provider, config.create_transform_log_group


@pytest.mark.parametrize("dev_edits, defaults", [
    ([located("111122223333")], {}),                                                   # both named
    ([], {"default_account": "111122223333", "default_region": "eu-west-1"}),          # dev's is the caller's
], ids=["named", "callers"])
def test_unset_the_first_environment_of_an_account_creates_its_singletons(dev_edits, defaults):
    """cdk.json as shipped sets neither: dev and prod in one account synthesize, dev (first) creating both."""
    environments = both({"dev": dev_edits})
    assert creates(environments, "dev", **defaults) == (True, True)
    assert creates(environments, "prod", **defaults) == (False, False)


def test_unset_yields_to_an_environment_that_sets_it_true_and_to_none_elsewhere():
    environments = both({"dev": [located("111122223333")], "prod": [setting("review.create_oidc_provider", True)]})
    assert creates(environments, "dev") == (False, True)
    assert creates(environments, "prod") == (True, False)
    elsewhere = both({"dev": [located(OTHER_ACCOUNT)]})
    assert creates(elsewhere, "dev") == creates(elsewhere, "prod") == (True, True)
    unknown = both({})                                                                 # dev's account unknown
    assert creates(unknown, "dev") == creates(unknown, "prod") == (True, True)
    named = both({"dev": [located("111122223333"), setting("review.oidc_provider_arn", PROVIDER)]})
    assert creates(named, "dev") == (False, True) and creates(named, "prod") == (True, False)


def test_an_existing_provider_is_named_by_its_arn():
    config = parse(edit=lambda e: e["review"].update(create_oidc_provider=False, oidc_provider_arn=PROVIDER))
    assert config.review.oidc_provider_arn == PROVIDER and not config.review.create_oidc_provider


@pytest.mark.parametrize("edit, expected", [
    (lambda e: e["review"].update(create_oidc_provider=True, oidc_provider_arn=PROVIDER),
     "environments.prod.review.oidc_provider_arn: names an existing provider, but "
     "environments.prod.review.create_oidc_provider is true"),
    (lambda e: e["review"].update(create_oidc_provider=False, oidc_provider_arn=PROVIDER.replace("111122223333",
                                                                                                  OTHER_ACCOUNT)),
     f"environments.prod.review.oidc_provider_arn: '{PROVIDER.replace('111122223333', OTHER_ACCOUNT)}' is in "
     f"account {OTHER_ACCOUNT}, not this environment's 111122223333"),
    (lambda e: e["review"].update(create_oidc_provider=False, oidc_provider_arn="arn:aws:iam::111122223333:"
                                  "oidc-provider/gitlab.com"),
     "environments.prod.review.oidc_provider_arn: 'arn:aws:iam::111122223333:oidc-provider/gitlab.com' is not the "
     "ARN of an IAM OIDC provider for token.actions.githubusercontent.com"),
    (setting("bootstrap", {"kms_key_arn": "alias/cdk"}),
     "environments.prod.bootstrap.kms_key_arn: 'alias/cdk' is not a KMS key ARN"),
    (setting("bootstrap", {"kms_key_arn": BOOTSTRAP_KEY.replace("eu-west-1", "us-east-1")}),
     "environments.prod.bootstrap.kms_key_arn: '" + BOOTSTRAP_KEY.replace("eu-west-1", "us-east-1") + "' is in "
     "region us-east-1, not this environment's eu-west-1"),
    (setting("bootstrap", {"kms_key_arn": BOOTSTRAP_KEY.replace("111122223333", OTHER_ACCOUNT)}),
     f"environments.prod.bootstrap.kms_key_arn: '{BOOTSTRAP_KEY.replace('111122223333', OTHER_ACCOUNT)}' is in "
     f"account {OTHER_ACCOUNT}, not this environment's 111122223333"),
    (setting("create_transform_log_group", "no"),
     "environments.prod.create_transform_log_group: expected true or false"),
], ids=["arn-and-create", "arn-other-account", "arn-not-github", "key-not-arn", "key-other-region",
        "key-other-account", "transform-flag"])
def test_shared_resource_settings_are_checked(edit, expected):
    with pytest.raises(ConfigError) as error:
        parse("prod", edit=edit)
    assert expected in str(error.value), str(error.value)


def test_the_bootstrap_key_is_read():
    assert parse("prod").bootstrap.kms_key_arn is None
    assert parse("prod", edit=setting("bootstrap", {"kms_key_arn": BOOTSTRAP_KEY})).bootstrap.kms_key_arn == \
        BOOTSTRAP_KEY


@pytest.mark.parametrize("kind", ["cpu", "gpu", "text_generation"])
@pytest.mark.parametrize("registry_region", ["us-east-1", "eu-central-1"])
def test_an_image_pin_from_another_regions_registry_is_refused(kind, registry_region):
    uri = f"763104351884.dkr.ecr.{registry_region}.amazonaws.com/llama-cpp@{DLC_DIGEST}"
    with pytest.raises(ConfigError) as error:
        parse("prod", edit=setting(f"pins.images.{kind}", uri))
    assert f"environments.prod.pins.images.{kind}: {uri} is in {registry_region}, but this environment deploys to " \
           f"eu-west-1: SageMaker pulls images only from ECR in the endpoint's region" in str(error.value)


@pytest.mark.parametrize("kind", ["cpu", "gpu", "text_generation"])
def test_an_image_pin_from_the_environments_region_is_accepted(kind):
    uri = f"763104351884.dkr.ecr.eu-west-1.amazonaws.com/llama-cpp@{DLC_DIGEST}"
    in_devs = uri.replace("763104351884", "111122223333")       # prod pulls from its source's account only
    assert getattr(parse("prod", edit=setting(f"pins.images.{kind}", in_devs)).pins.images, kind).repository.region \
        == "eu-west-1"
    # An environment whose region is the caller's, and the caller has none: nothing to compare with yet.
    assert parse("dev", edit=setting(f"pins.images.{kind}", uri.replace("eu-west-1", "us-east-1"))).region is None


def test_prod_retains_its_logs_and_dev_does_not():
    assert parse("prod").retain_logs is True and parse("dev").retain_logs is False


# --- issue 33: build once in dev, promote to prod by digest (artifacts_from) ---------------------------------

PROMOTE = "python -m endpoint_client promote --from dev --to prod"


def environments_with(**edits):
    """cdk.json's context pinned for prod (prod's pins name dev's artifacts), each environment edited by name; an
    edit for a name cdk.json lacks adds that environment as a copy of dev first."""
    context = context_for("prod")
    environments = context["environments"]
    # dev retains what prod pins, so it names where it deploys (stacks/config.py), as a user's cdk.json would.
    environments["dev"].update(account=environments["dev"].get("account") or "111122223333",
                               region=environments["dev"].get("region") or "eu-west-1")
    for name, edit in edits.items():
        if name not in environments:
            environments[name] = {**cdk_json_context()["environments"]["dev"], "name_prefix": f"decision-{name}"}
        edit(environments[name])
    return environments


def test_prod_deploys_devs_artifacts_and_dev_names_prods_execution_roles():
    prod = parse("prod")
    assert prod.artifacts_from == "dev" and prod.build is None
    assert prod.artifact_source.name == "dev" and prod.artifact_source.model_pin == "qwen3.5-4b"
    assert prod.model_pin_name == "qwen3.5-4b"
    assert prod.pins.images.cpu.repository.name.startswith("decision-dev-artifacts-imagerepository")
    assert prod.pins.model.bucket.startswith("decision-dev-artifacts-artifactbucket")
    assert prod.artifact_consumers == ()
    assert prod.execution_role_name("text_generation") == "decision-prod-text-generation-execution"
    environments = context_for("dev")["environments"]
    dev = load_environment(environments, "dev", model_pins=cdk_app.model_pin_names())
    (consumer,) = dev.artifact_consumers
    # prod names no account yet (it must, to deploy): dev's policies name dev's own account (None: the stack's).
    assert (consumer.name, consumer.account, consumer.region, consumer.name_prefix) == ("prod", None, None,
                                                                                         "decision-prod")
    assert consumer.execution_role_names == ("decision-prod-cpu-execution", "decision-prod-gpu-execution",
                                             "decision-prod-text-generation-execution",
                                             "decision-prod-async-execution")
    assert dev.artifact_source is None and dev.build is not None


def test_a_consumer_in_another_account_is_named_by_its_account():
    environments = environments_with(prod=lambda e: e.update(account=OTHER_ACCOUNT, endpoints=["cpu"]),
                                     dev=located("111122223333"))
    test_pins.promote_into(environments, "prod")
    dev = load_environment(environments, "dev", model_pins=cdk_app.model_pin_names())
    (consumer,) = dev.artifact_consumers
    assert (consumer.account, consumer.region, consumer.endpoint_kinds) == (OTHER_ACCOUNT, "eu-west-1", ("cpu",))
    prod = load_environment(environments, "prod", model_pins=cdk_app.model_pin_names())
    assert prod.pins.images.cpu.repository.account == "111122223333" == prod.artifact_source.account


def test_rebuilding_for_prod_stays_possible():
    def rebuild(environment):
        building_its_own(environment)
        environment["pins"] = copy.deepcopy(TEST_PINS)
    prod = parse("prod", edit=rebuild)
    assert prod.artifacts_from is None and prod.artifact_source is None and prod.build.log_retention_days == 90
    assert prod.pins.images.cpu.repository is None and prod.pins.model.bucket is None
    environments = context_for("prod", edit=rebuild)["environments"]
    environments["dev"]["artifacts"]["removal_policy"] = "destroy"      # nobody pins dev's artifacts any more
    assert load_environment(environments, "dev", model_pins=cdk_app.model_pin_names()).artifact_consumers == ()


def _bare_cpu_digest(environment):
    environment["pins"]["images"]["cpu"] = TEST_PINS["images"]["cpu"]


def _with_build(environment):
    environment["build"] = cdk_json_context()["environments"]["dev"]["build"]


@pytest.mark.parametrize("edits, env, expected", [
    ({"prod": setting("artifacts_from", "staging")}, "prod",
     "environments.prod.artifacts_from: 'staging' is not an environment in cdk.json (one of: dev)"),
    ({"prod": setting("artifacts_from", 42)}, "prod",
     "environments.prod.artifacts_from: 42 is not an environment in cdk.json (one of: dev)"),
    ({"prod": setting("artifacts_from", "prod")}, "prod",
     "environments.prod.artifacts_from: names this environment itself: name the environment whose builds it deploys "
     "(one of: dev)"),
    ({"qa": setting("artifacts_from", "dev"), "prod": setting("artifacts_from", "qa")}, "prod",
     "environments.prod.artifacts_from: 'qa' takes its artifacts from 'dev' itself; name the environment that "
     "builds them ('dev'): an environment promotes from the one that built, with no chains"),
    ({"qa": removing("build"), "prod": setting("artifacts_from", "qa")}, "prod",
     "environments.prod.artifacts_from: 'qa' has no build section, so it builds nothing to take"),
    ({"prod": _with_build}, "prod",
     "environments.prod.build: is set, but environments.prod.artifacts_from is 'dev': an environment either builds "
     "its artifacts (build) or deploys dev's (artifacts_from), not both; remove one of the two keys"),
    ({"prod": removing("artifacts_from")}, "prod",
     "environments.prod.build: is required unless environments.prod.artifacts_from names the environment whose "
     "builds this one deploys"),
    ({"prod": _bare_cpu_digest}, "prod",
     f"environments.prod.pins.images.cpu: {TEST_PINS['images']['cpu']} names no repository, but this environment has "
     f"no repository of its own to pull from (environments.prod.artifacts_from is 'dev'): pin dev's artifacts as "
     f"`{PROMOTE}` writes them"),
    ({"prod": lambda e: e["pins"]["model"].pop("bucket")}, "prod",
     "environments.prod.pins.model.bucket: is required because environments.prod.artifacts_from is 'dev' (this "
     f"environment builds no model archive): pin dev's artifacts as `{PROMOTE}` writes them, dev's artifact bucket "
     "beside s3_key"),
    ({"prod": lambda e: e["pins"]["model"].update(bucket="Decision_Dev")}, "prod",
     "environments.prod.pins.model.bucket: 'Decision_Dev' is not an S3 bucket name"),
    ({"prod": lambda e: e["pins"]["model"].update(bucket="192.168.5.4")}, "prod",
     "environments.prod.pins.model.bucket: '192.168.5.4' is not an S3 bucket name"),
    ({"prod": lambda e: e["pins"]["model"].update(bucket="decision..dev")}, "prod",
     "environments.prod.pins.model.bucket: 'decision..dev' is not an S3 bucket name"),
    ({"dev": setting("region", "us-east-1")}, "prod",
     "environments.prod.artifacts_from: 'dev' deploys to us-east-1, this environment to eu-west-1: SageMaker pulls "
     "images only from ECR in the endpoint's own region"),
    ({"dev": setting("account", OTHER_ACCOUNT)}, "prod",
     f"environments.prod.pins.images.gpu: 111122223333.dkr.ecr.eu-west-1.amazonaws.com/"
     f"{test_pins.example_artifact_names('decision-dev')[0]}@{TEST_PINS['images']['gpu']} is in account 111122223333, "
     f"but artifacts_from 'dev' builds in account {OTHER_ACCOUNT}: only its repository allows this environment's "
     f"pull"),
    ({"prod": setting("name_prefix", "Decision_Prod")}, "dev",
     "environments.prod.name_prefix: 'Decision_Prod' is not a name prefix (its artifacts_from names dev, whose "
     "policies name its execution roles)"),
    ({"prod": setting("account", "12345")}, "dev",
     "environments.prod.account: '12345' is not a 12-digit AWS account id (its artifacts_from names dev"),
    ({"prod": setting("endpoints", ["cpu", "tpu"])}, "dev",
     "environments.prod.endpoints: expected a list of endpoint kinds (cpu, gpu, text_generation, async), got a "
     "list"),
    ({"prod": setting("artifact_consumers", [])}, "prod", "environments.prod.artifact_consumers: unknown key"),
], ids=["unknown", "not-a-name", "itself", "chain", "source-builds-nothing", "both", "neither", "bare-digest",
        "model-without-bucket", "bucket-case", "bucket-ip", "bucket-dots", "other-region", "other-account",
        "consumer-prefix", "consumer-account", "consumer-endpoints", "computed-key"])
def test_artifacts_from_problems_are_named_by_key_path(edits, env, expected):
    with pytest.raises(ConfigError) as error:
        load_environment(environments_with(**edits), env, model_pins=cdk_app.model_pin_names())
    assert expected in str(error.value), str(error.value)


def test_the_sources_location_is_compared_only_where_cdk_json_names_it():
    """dev leaves account and region to the caller's credentials: a synthesis of prod elsewhere (CI in prod's
    account, another default region) cannot tell where dev was deployed, so it compares nothing."""
    context = context_for("prod")
    for key in ("account", "region"):     # (synthesizing prod does not validate dev, which would have to name them)
        context["environments"]["dev"].pop(key, None)
    config = load_environment(context["environments"], "prod", model_pins=cdk_app.model_pin_names(),
                              default_account=OTHER_ACCOUNT, default_region="us-east-1")
    assert config.artifact_source.account is None and config.artifact_source.region is None
    assert config.pins.images.cpu.repository.account == "111122223333"


# --- issue 47: prod's source keeps what prod pins; prod's pins name the report they were promoted on -------------

def test_a_source_whose_artifacts_a_consumer_pins_must_retain_them():
    """dev with removal_policy destroy while prod's pins name dev's images and archive: `cdk destroy -c env=dev`
    would delete them from under prod. Synthesizing either environment refuses; a prod that pins nothing (cdk.json
    as shipped) leaves dev free to destroy its own."""
    environments = environments_with(dev=lambda e: e["artifacts"].update(removal_policy="destroy"))
    expected = ("environments.dev.artifacts.removal_policy: is not 'retain', but environments.prod.pins name dev's "
                "images and model archive")
    for env in ("dev", "prod"):
        with pytest.raises(ConfigError) as error:
            load_environment(environments, env, model_pins=cdk_app.model_pin_names())
        assert any(problem.startswith(expected) for problem in error.value.problems), error.value.problems
    shipped = cdk_json_context()["environments"]
    assert shipped["dev"]["artifacts"]["removal_policy"] == "destroy"
    load_environment(shipped, "dev", model_pins=cdk_app.model_pin_names())
    assert parse("prod").artifact_source.name == "dev"          # pinned, with dev retaining (context_for)


def test_promoted_pins_name_the_acceptance_report_they_were_promoted_on():
    config = parse("prod")
    assert config.pins.acceptance is not None and config.pins.acceptance.key.startswith("acceptance/dev/")
    with pytest.raises(ConfigError, match=r"environments\.prod\.pins\.acceptance: is required because these pins "
                                          r"name dev's artifacts"):
        parse("prod", edit=lambda e: e["pins"].pop("acceptance"))
    with pytest.raises(ConfigError, match=r"environments\.dev\.pins\.acceptance: is set, but this environment builds "
                                          r"its own artifacts"):
        parse("dev", edit=lambda e: e["pins"].update(acceptance=test_pins.example_acceptance_pin("dev", "b-1-2")))
    with pytest.raises(ConfigError, match=r"environments\.prod\.pins\.acceptance\.key: .* is not a report's key"):
        parse("prod", edit=lambda e: e["pins"]["acceptance"].update(key="acceptance/dev/latest.json"))
