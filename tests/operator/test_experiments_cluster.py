"""RLExperiments on the real control plane: the CRD refuses bad experiments naming the field, the
operator runs trials within parallelism, heartbeats (posted as a trainer posts them) drive the
objective, pruning and the leaderboard, the garbage collector deletes trials with their experiment,
an operator killed mid-experiment resumes it with no duplicate trial, and the admission policy
checks an experiment's template against its creator."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes.client.exceptions import ApiException
from rljob_contract.experiment import parse_experiment

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    annotate_pod,
    deep_update,
    get_job,
    job_manifest,
    job_pods,
    token_for,
    wait_for_events,
)

pytestmark = pytest.mark.cluster

def exp_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    path = f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rlexperiments"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def template() -> dict[str, Any]:
    """A one-worker trial template (the tests' small job)."""
    spec = copy.deepcopy(job_manifest("t", replicas=1)["spec"])
    spec["training"]["maxSteps"] = 40
    return spec


def experiment(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": name},
            "spec": {"template": template(), **spec}}


def evaluated_template(every: int = 10) -> dict[str, Any]:
    """The template, evaluated on held-out prompts every ``every`` steps (eval/repeat_char)."""
    spec = template()
    spec["training"]["evaluation"] = {"heldOutFraction": 0.2, "everySteps": every}
    return spec


ARMS = [{"name": "high", "overrides": {"training": {"learningRate": 0.003}}},
        {"name": "low", "overrides": {"training": {"learningRate": 1e-5}}}]


def create(kube: Any, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    return kube.request("POST", exp_path(namespace), doc, query={"fieldValidation": "Strict"})  # type: ignore[no-any-return]


def get(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    return kube.request("GET", exp_path(namespace, name))  # type: ignore[no-any-return]


def trial_jobs(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kube.request("GET", kube.job_path(namespace), query={"labelSelector": f"rljob.dev/experiment={name}"})
    return sorted(out.get("items") or [], key=lambda j: j["metadata"]["name"])


def trials_when(kube: Any, namespace: str, name: str, count: int) -> list[dict[str, Any]] | None:
    """The experiment's trial jobs once there are ``count`` of them."""
    jobs = trial_jobs(kube, namespace, name)
    return jobs if len(jobs) == count else None


def heartbeat(kube: Any, op: Any, namespace: str, job: str, points: list[tuple[int, float]], final: bool,
              evaluations: dict[int, float] | None = None) -> None:
    """Post ``points`` as the trainer's rank 0 would: with its pod's projected, audience-bound token (and at
    the steps of ``evaluations``, the held-out metric eval/repeat_char in the step's metrics)."""
    pod = wait_for(lambda: next(iter(job_pods(kube, namespace, job)), None), 60, message=f"{job}'s pod")
    ca = kube.request("GET", kube.core_path(namespace, "configmaps", f"{job}-config"))["data"]["status-ca.crt"]
    ca_file = Path(op.log).with_name(f"{job}-ca.crt")
    ca_file.write_text(ca)
    token = token_for(kube, namespace, "default", "rljob-status", pod=pod)
    url = f"{op.status_url}/api/v1/namespaces/{namespace}/rltrainingjobs/{job}/heartbeat"
    for i, (step, reward) in enumerate(points):
        metrics = {"kl": 0.01, **({"eval/repeat_char": evaluations[step]} if step in (evaluations or {}) else {})}
        body = {"step": step, "reward": reward, "loss": 1.0, "metrics": metrics,
                "checkpoint": f"s3://ckpt/{job}/checkpoint-{step}", "final": final and i == len(points) - 1}
        response = requests.post(url, json=body, headers={"Authorization": f"Bearer {token}"},
                                 verify=str(ca_file), timeout=10)
        assert response.status_code == 202, response.text


def finish(kube: Any, namespace: str, job: str) -> None:
    """The trial's worker exits 0 (a fake kubelet fate): the operator marks the job Succeeded."""
    pods = wait_for(lambda: job_pods(kube, namespace, job), 60, message=f"{job}'s pods")
    for pod in pods:
        annotate_pod(kube, namespace, pod["metadata"]["name"], {"rljob.dev/fake-exit-code": "0"})


def wait_exp(kube: Any, namespace: str, name: str, check: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    try:
        def reached() -> dict[str, Any] | None:
            found = get(kube, namespace, name)
            return found if check(found.get("status") or {}) else None

        return wait_for(reached, timeout, interval=0.3, message=what)
    except TimeoutError as err:
        raise AssertionError(f"{err}\nstatus: {yaml.safe_dump(get(kube, namespace, name).get('status'))}") from None


def curve_points(kube: Any, namespace: str, job: str) -> int:
    return len(((get_job(kube, namespace, job).get("status") or {}).get("progress") or {}).get("curve") or [])


# ------------------------------------------------------------------------------------ the CRD

#: (case, spec patch, what the refusal must name).
BAD_EXPERIMENTS: list[tuple[str, dict[str, Any], str]] = [
    ("template-generation-batch", {"arms": ARMS, "template": {**template(), "training": {
        **template()["training"], "numGenerations": 3}}}, "spec.template.training.numGenerations"),
    ("template-unknown-field", {"arms": ARMS, "template": {**template(), "training": {
        **template()["training"], "learningRat": 0.1}}}, "spec.template.training.learningRat"),
    ("template-trl-managed", {"arms": ARMS, "template": {**template(), "training": {
        **template()["training"], "trl": {"learning_rate": 0.1}}}}, "spec.template.training.trl.learning_rate"),
    ("search-min-not-below-max", {"search": {"maxTrials": 2, "parameters": [
        {"name": "training.learningRate", "type": "float", "min": 0.1, "max": 0.01}]}},
     "spec.search.parameters[0].max"),
    ("search-log-from-zero", {"search": {"maxTrials": 2, "parameters": [
        {"name": "training.learningRate", "type": "float", "min": 0, "max": 0.01, "log": True}]}},
     "spec.search.parameters[0].min"),
    ("search-not-training", {"search": {"maxTrials": 2, "parameters": [
        {"name": "image", "type": "categorical", "values": ["evil"]}]}}, "spec.search.parameters[0].name"),
    ("search-unknown-type", {"search": {"maxTrials": 2, "parameters": [
        {"name": "training.beta", "type": "double", "min": 0, "max": 1}]}}, "spec.search.parameters[0].type"),
    ("both-arms-and-search", {"arms": ARMS, "search": {"maxTrials": 2, "parameters": [
        {"name": "training.beta", "type": "float", "min": 0, "max": 1}]}}, "spec.arms"),
    ("neither-arms-nor-search", {}, "spec.arms"),
    ("duplicate-arm", {"arms": [ARMS[0], ARMS[0]]}, "spec.arms[1]"),
    # Bounded, so the status (which records every trial) stays under the object size limit.
    ("too-many-arm-trials", {"arms": [{"name": f"a{i}", "overrides": {}} for i in range(10)], "seeds": 51},
     "spec.seeds"),
    ("too-many-search-trials", {"search": {"maxTrials": 501, "parameters": [
        {"name": "training.beta", "type": "float", "min": 0, "max": 1}]}}, "spec.search.maxTrials"),
    ("eval-objective-without-evaluation", {"arms": ARMS, "objective": {"metric": "eval/repeat_char"}},
     "spec.objective.metric"),
    ("eval-objective-rung-between-evaluations", {"arms": ARMS, "template": evaluated_template(), "objective": {
        "metric": "eval/repeat_char"}, "earlyStopping": {"minSteps": 10, "interval": 5}}, "spec.earlyStopping"),
    ("eval-objective-rung-before-evaluation", {"arms": ARMS, "template": evaluated_template(), "objective": {
        "metric": "eval/repeat_char"}, "earlyStopping": {"rungs": [10, 25]}}, "spec.earlyStopping"),
]


def test_a_bad_template_or_search_space_is_refused_at_kubectl_apply_naming_the_field(
        kube: Any, experiment_crd: Any, namespace: str, control_plane: Any) -> None:
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig),
               "--namespace", namespace, "apply", "-f", "-"]
    problems = []
    for case, spec, field in BAD_EXPERIMENTS:
        doc = experiment(case, **spec)
        if "template" in spec:
            doc["spec"]["template"] = spec["template"]
        result = subprocess.run(kubectl, input=yaml.safe_dump(doc), capture_output=True, text=True, timeout=60)
        if result.returncode == 0 or field not in result.stderr:
            problems.append(f"{case}: rc={result.returncode}, expected {field!r} in: {result.stderr[:500]}")
    assert not problems, "\n".join(problems)
    good = subprocess.run(kubectl, input=yaml.safe_dump(experiment("good", arms=ARMS, seeds=2)),
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stderr
    # Rungs where the template evaluates (10, 20, 30: 40 is maxSteps, never a rung), or a training metric at any.
    for name, spec in (("eval-rungs", {"template": evaluated_template(), "objective": {"metric": "eval/repeat_char"},
                                       "earlyStopping": {"minSteps": 10, "interval": 10}}),
                       ("eval-rung-last", {"template": evaluated_template(20), "objective": {
                           "metric": "eval/repeat_char"}, "earlyStopping": {"minSteps": 20, "interval": 25}}),  # one rung: 20
                       ("reward-rungs", {"earlyStopping": {"minSteps": 10, "interval": 5}})):
        doc = experiment(name, arms=ARMS, **{k: v for k, v in spec.items() if k != "template"})
        doc["spec"]["template"] = spec.get("template", doc["spec"]["template"])
        applied = subprocess.run(kubectl, input=yaml.safe_dump(doc), capture_output=True, text=True, timeout=60)
        assert applied.returncode == 0, (name, applied.stderr)
        parse_experiment(doc, name)  # and the models agree
    printed = subprocess.run([*kubectl[:5], "get", "rlexp", "good"], capture_output=True, text=True, check=True)
    assert printed.stdout.split()[:6] == ["NAME", "PHASE", "TRIALS", "BEST", "OBJECTIVE", "AGE"], printed.stdout


# ----------------------------------------------------------------------------- the controller


def test_trials_run_within_parallelism_and_heartbeats_make_the_better_arm_win(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    op = operator()
    create(kube, namespace, {**experiment("ab", arms=ARMS, seeds=2, parallelism=2),
                             "metadata": {"name": "ab", "labels": {"team": "research"}}})
    first = wait_for(lambda: trials_when(kube, namespace, "ab", 2), 60,
                     message="the first two trials")
    assert [j["metadata"]["name"] for j in first] == ["ab-high-s0", "ab-high-s1"]
    meta = first[0]["metadata"]
    # The experiment's labels are the trials' (a Kueue queue name too: test_experiments_decisions; a
    # queue label here would make the trials wait for a Kueue this cluster does not run).
    assert meta["labels"]["team"] == "research" and meta["labels"]["rljob.dev/arm"] == "high"
    owner = meta["ownerReferences"][0]
    assert owner["kind"] == "RLExperiment" and owner["controller"] and owner["blockOwnerDeletion"]
    assert first[0]["spec"]["training"]["learningRate"] == 0.003

    rewards = {"high": [0.3, 0.6, 0.8, 0.9], "low": [0.1, 0.1, 0.12, 0.1]}

    def run_trials(jobs: list[dict[str, Any]], started: int) -> None:
        for i, job in enumerate(jobs):
            name, arm = job["metadata"]["name"], job["metadata"]["labels"]["rljob.dev/arm"]
            points = [(10 * (k + 1), r + 0.01 * i) for k, r in enumerate(rewards[arm])]
            heartbeat(kube, op, namespace, name, points, final=True)
            wait_for(lambda n=name: curve_points(kube, namespace, n) == 4, 30, message=f"{name}'s curve")
        # Within parallelism: while both run (the experiment has been woken by every heartbeat), no third.
        assert len(trial_jobs(kube, namespace, "ab")) == started
        for job in jobs:
            finish(kube, namespace, job["metadata"]["name"])

    run_trials(first, 2)
    rest = wait_for(lambda: trials_when(kube, namespace, "ab", 4), 60,
                    message="the next two trials once two finished")[2:]
    assert [j["metadata"]["name"] for j in rest] == ["ab-low-s0", "ab-low-s1"]
    run_trials(rest, 4)

    done = wait_exp(kube, namespace, "ab", lambda s: s.get("phase") == "Succeeded", "experiment Succeeded", 120)
    status = done["status"]
    assert status["summary"] == "4/4" and status["bestName"] == "high"
    assert status["winner"]["arm"] == "high" and status["winner"]["runnerUp"] == "low"
    assert "Welch" in status["winner"]["test"] and status["winner"]["significant"] is True
    high = next(a for a in status["arms"] if a["name"] == "high")
    assert high.get("n") == 2 and high["ci95Low"] < high["mean"] < high["ci95High"], yaml.safe_dump(status)
    assert abs(high["mean"] - 0.655) < 0.01  # lastMean over the last 5 (all 4) logged rewards, two seeds
    assert status["best"]["checkpoint"].startswith("s3://ckpt/ab-high-") and status["best"]["arm"] == "high"
    assert [row["name"] for row in status["leaderboard"]] == ["high", "low"]
    events = wait_for_events(kube, namespace, "ab", "WinnerFound")
    assert [e["reason"] for e in events].count("TrialStarted") == 4
    assert len(trial_jobs(kube, namespace, "ab")) == 4

    # Finished, the experiment causes no more writes: two more reconciles (each woken by a label) patch nothing.
    patches = api_requests(op, "PATCH")
    for poke in ("1", "2"):
        seen = api_requests(op, "GET")
        kube.request("PATCH", exp_path(namespace, "ab"), {"metadata": {"labels": {"poke": poke}}},
                     content_type="application/merge-patch+json")
        wait_for(lambda s=seen: api_requests(op, "GET") > s, 30, message="a reconcile after the poke")
    assert api_requests(op, "PATCH") == patches


def test_a_tenants_forged_trial_is_a_conflict_and_never_ranked(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any, control_plane: Any,
        service_account_kubeconfig: Any) -> None:
    """A tenant who may create jobs (and write their status) makes an RLTrainingJob with the experiment's
    ownerReference and labels and a perfect Succeeded curve: the experiment names it a conflict (status,
    condition, Event) and ranks only the trials it created, by the UIDs it recorded."""
    op = operator()
    created = create(kube, namespace, experiment("guard", arms=ARMS))
    trials = wait_for(lambda: trials_when(kube, namespace, "guard", 2), 60, message="two trials")
    uids = sorted(j["metadata"]["uid"] for j in trials)
    wait_exp(kube, namespace, "guard", lambda s: sorted(t.get("uid", "") for t in s.get("trials") or []) == uids,
             "the trials' UIDs recorded")
    _role(control_plane, namespace, "jobs-editor", [{"apiGroups": ["rljob.dev"], "resources": [
        "rltrainingjobs", "rltrainingjobs/status"], "verbs": ["get", "list", "create", "patch"]}], "tenant")
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(service_account_kubeconfig("tenant")),
               "--namespace", namespace]
    fake = copy.deepcopy(trials[0])
    fake["metadata"] = {"name": "guard-winner", "labels": trials[0]["metadata"]["labels"], "ownerReferences": [
        {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "name": "guard",
         "uid": created["metadata"]["uid"], "controller": True}]}
    fake.pop("status", None)
    subprocess.run([*kubectl, "create", "-f", "-"], input=yaml.safe_dump(fake), check=True, capture_output=True,
                   text=True, timeout=60)
    perfect = {"status": {"phase": "Succeeded", "progress": {
        "step": 40, "checkpoint": "s3://evil/ckpt", "curve": [{"step": 10 * k, "reward": 1.0} for k in range(1, 5)]}}}
    subprocess.run([*kubectl, "patch", "rltrainingjob", "guard-winner", "--subresource=status", "--type=merge",
                    "-p", yaml.safe_dump(perfect)], check=True, capture_output=True, text=True, timeout=60)

    seen = wait_exp(kube, namespace, "guard", lambda s: s.get("conflicts") == ["guard-winner"],
                    "the forged trial reported as a conflict")
    clash = next(c for c in seen["status"]["conditions"] if c["type"] == "TrialConflict")
    assert clash["status"] == "True" and "guard-winner" in clash["message"]
    event = wait_for_events(kube, namespace, "guard", "TrialConflict")
    assert any("guard-winner" in e["message"] for e in event if e["reason"] == "TrialConflict")
    for job in trials:
        heartbeat(kube, op, namespace, job["metadata"]["name"], [(10, 0.2), (20, 0.3)], final=True)
        wait_for(lambda n=job["metadata"]["name"]: curve_points(kube, namespace, n) == 2, 30, message="its curve")
        finish(kube, namespace, job["metadata"]["name"])
    done = wait_exp(kube, namespace, "guard", lambda s: s.get("phase") == "Succeeded", "experiment Succeeded", 120)
    status = done["status"]
    assert status["summary"] == "2/2" and [t["name"] for t in status["trials"]] == ["guard-high-s0", "guard-low-s0"]
    assert "guard-winner" not in yaml.safe_dump(status["leaderboard"]) + yaml.safe_dump(status["arms"])
    assert status["bestObjective"] < 0.5 and status["best"]["checkpoint"] != "s3://evil/ckpt"
    assert status["conflicts"] == ["guard-winner"]


def test_the_largest_status_an_experiment_can_have_is_accepted_well_under_the_size_limit(
        kube: Any, experiment_crd: Any, namespace: str) -> None:
    """The status the operator writes at the maxima (tests/support/experiment_maxima.py: MAX_TRIALS trials with the
    longest names, parameters, messages, checkpoints and curves, and conflicts) is accepted by the real API
    server's status subresource (the CRD's own limits included) and the stored object stays under 1.1 MiB
    (etcd's limit is 1.5 MiB)."""
    from tests.support.experiment_maxima import largest_status

    doc, status = largest_status(template())
    doc["metadata"] = {"name": "huge"}
    del doc["status"]
    create(kube, namespace, doc)
    kube.request("PATCH", exp_path(namespace, "huge", "status"), {"status": status},
                 content_type="application/merge-patch+json")
    stored = get(kube, namespace, "huge")
    assert len(stored["status"]["trials"]) == len(status["trials"]) and stored["status"]["phase"] == status["phase"]
    size = len(json.dumps(stored))
    assert size < 1.1 * 1024 * 1024, size


def api_requests(op: Any, verb: str) -> float:
    """The operator's count of ``verb`` requests on rlexperiments (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(op.metrics_text())
               for sample in family.samples
               if sample.name == "rljob_operator_api_requests_total"
               and sample.labels.get("resource") == "rlexperiments" and sample.labels.get("verb") == verb)


def test_a_hopeless_trial_is_pruned_at_a_rung(kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    op = operator()
    arms = [{"name": n, "overrides": {}} for n in ("a", "b", "c")]
    create(kube, namespace, experiment("prune", arms=arms, earlyStopping={"minSteps": 10, "interval": 10,
                                                                          "minTrials": 2}))
    jobs = wait_for(lambda: trials_when(kube, namespace, "prune", 3), 60,
                    message="three trials")
    curves = {"a": [(10, 0.8), (20, 0.85)], "b": [(10, 0.7), (20, 0.75)], "c": [(10, 0.0), (20, 0.0)]}
    for job in jobs:  # the hopeless one last, so the others have reached the rung first
        heartbeat(kube, op, namespace, job["metadata"]["name"], curves[job["metadata"]["labels"]["rljob.dev/arm"]],
                  final=False)
    pruned = wait_exp(kube, namespace, "prune",
                      lambda s: any(t.get("phase") == "Pruned" for t in s.get("trials") or []), "a trial pruned")
    trial = next(t for t in pruned["status"]["trials"] if t["phase"] == "Pruned")
    assert trial["name"] == "prune-c-s0" and trial["pruned"] and trial["prunedAtStep"] in (10, 20)
    assert "median" in trial["message"]
    assert [t["phase"] for t in pruned["status"]["trials"] if t["name"] != "prune-c-s0"] == ["Running", "Running"]
    # Suspended, not deleted: its checkpoints and curve stay; its pods go.
    wait_for(lambda: get_job(kube, namespace, "prune-c-s0")["spec"]["runPolicy"]["suspend"] is True, 30,
             message="the pruned trial suspended")
    wait_for(lambda: not job_pods(kube, namespace, "prune-c-s0"), 60, message="the pruned trial's pods gone")
    wait_for_events(kube, namespace, "prune", "TrialPruned")


def test_an_eval_objective_prunes_and_ranks_by_the_held_out_metric_not_the_training_reward(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    """Trial c has the best training reward and the worst held-out metric: pruned at the rung on the metric
    evaluated there; of the two that finish, b (lower reward, better held-out metric) ranks first."""
    op = operator()
    arms = [{"name": n, "overrides": {}} for n in ("a", "b", "c")]
    create(kube, namespace, experiment("evalobj", arms=arms, template=evaluated_template(), objective={
        "metric": "eval/repeat_char", "k": 1}, earlyStopping={"minSteps": 10, "interval": 10, "minTrials": 2}))
    jobs = {j["metadata"]["labels"]["rljob.dev/arm"]: j["metadata"]["name"]
            for j in wait_for(lambda: trials_when(kube, namespace, "evalobj", 3), 60, message="three trials")}
    # Training reward at steps 5, 10, 15, 20; the held-out metric at the evaluations (0 and every 10).
    rewards = {"a": [0.5, 0.6, 0.7, 0.8], "b": [0.3, 0.4, 0.5, 0.6], "c": [0.8, 0.9, 0.95, 0.99]}
    evaluations = {"a": {10: 0.4, 20: 0.5}, "b": {10: 0.5, 20: 0.7}, "c": {10: 0.05, 20: 0.02}}
    for arm in ("a", "b", "c"):  # the gamed one last, so the others have reached the rung first
        heartbeat(kube, op, namespace, jobs[arm], [(5 * (k + 1), r) for k, r in enumerate(rewards[arm])],
                  final=arm != "c", evaluations=evaluations[arm])
    pruned = wait_exp(kube, namespace, "evalobj",
                      lambda s: any(t.get("phase") == "Pruned" for t in s.get("trials") or []), "a trial pruned")
    trial = next(t for t in pruned["status"]["trials"] if t["phase"] == "Pruned")
    assert trial["name"] == jobs["c"] and trial["prunedAtStep"] == 10, trial
    assert trial["message"].startswith("objective 0.05 at step 10 is worse than the median 0.45"), trial
    assert trial["curve"][0] == {"step": 10, "value": 0.05}  # its held-out curve, not its rewards
    for arm in ("a", "b"):
        finish(kube, namespace, jobs[arm])
    done = wait_exp(kube, namespace, "evalobj", lambda s: s.get("phase") == "Succeeded", "experiment Succeeded", 120)
    status = done["status"]
    assert [row["name"] for row in status["leaderboard"]] == ["b", "a"]
    assert {t["arm"]: t["objective"] for t in status["trials"] if t["phase"] == "Succeeded"} == {"a": 0.5, "b": 0.7}
    assert status["best"]["arm"] == "b" and status["winner"]["arm"] == "b"


def test_a_search_with_an_eval_objective_scores_its_trials_by_the_held_out_metric(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    """A search's trials are scored, and its best chosen, by the held-out metric: the trial with the
    better training reward and the worse held-out metric is second."""
    op = operator()
    search = {**SEARCH, "maxTrials": 2, "parallelism": 2}
    create(kube, namespace, experiment("evalsearch", search=search, template=evaluated_template(),
                                       objective={"metric": "eval/repeat_char", "k": 1}))
    jobs = sorted(j["metadata"]["name"] for j in wait_for(lambda: trials_when(kube, namespace, "evalsearch", 2), 60,
                                                          message="two trials"))
    rewards = {jobs[0]: [0.8, 0.9, 0.95, 0.99], jobs[1]: [0.2, 0.3, 0.4, 0.5]}
    evaluations = {jobs[0]: {10: 0.1, 20: 0.2}, jobs[1]: {10: 0.5, 20: 0.8}}
    for job in jobs:
        heartbeat(kube, op, namespace, job, [(5 * (k + 1), r) for k, r in enumerate(rewards[job])], final=True,
                  evaluations=evaluations[job])
        finish(kube, namespace, job)
    done = wait_exp(kube, namespace, "evalsearch", lambda s: s.get("phase") == "Succeeded", "search Succeeded", 120)
    status = done["status"]
    assert {t["name"]: t["objective"] for t in status["trials"]} == {jobs[0]: 0.2, jobs[1]: 0.8}
    assert status["best"]["trial"] == jobs[1], status["best"]


def test_deleting_the_experiment_deletes_its_trials(kube: Any, experiment_crd: Any, namespace: str,
                                                    operator: Any) -> None:
    operator()
    create(kube, namespace, experiment("gone", arms=ARMS))
    wait_for(lambda: len(trial_jobs(kube, namespace, "gone")) == 2, 60, message="two trials")
    kube.request("DELETE", exp_path(namespace, "gone"), {"propagationPolicy": "Foreground"})
    # The real garbage collector (kube-controller-manager) deletes the owned trials, then the experiment.
    wait_for(lambda: not trial_jobs(kube, namespace, "gone"), 90, message="trials deleted by the garbage collector")
    wait_for(lambda: not _exists(kube, namespace, "gone"), 60, message="the experiment deleted")


def _exists(kube: Any, namespace: str, name: str) -> bool:
    try:
        get(kube, namespace, name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _record_pods(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"rljob.dev/experiment={name},app.kubernetes.io/component=record"
    return kube.request("GET", kube.core_path(namespace, "pods"),  # type: ignore[no-any-return]
                        query={"labelSelector": selector}).get("items") or []


def _recorded(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Recorded"), None)


def test_a_concluded_tracked_experiment_records_its_verdict_through_one_owned_record_pod(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    """Two tracked experiments conclude: each gets one ConfigMap of its status and one record pod, owned by it,
    built as specified; the pod's exit (kwok's) is the condition Recorded, and a failed record leaves the verdict."""
    op = operator()
    tracked = template()
    tracked["training"]["tracking"] = {"mlflow": {"trackingUri": "http://mlflow.invalid:5000", "experiment": "lr"}}
    for name in ("rec", "rec-fails"):
        doc = experiment(name, arms=ARMS)
        doc["spec"]["template"] = tracked
        create(kube, namespace, doc)
    for name in ("rec", "rec-fails"):
        for job in wait_for(lambda n=name: trials_when(kube, namespace, n, 2), 60, message=f"{name}'s trials"):
            finish(kube, namespace, job["metadata"]["name"])
    for name, exit_code in (("rec", "0"), ("rec-fails", "1")):
        done = wait_exp(kube, namespace, name, lambda s: (_recorded(s) or {}).get("reason") == "Recording",
                        f"{name} Succeeded and recording", 120)
        assert done["status"]["phase"] == "Succeeded"
        # The condition may be written in the same pass that creates the pod: wait for it to be listed.
        (pod,) = wait_for(lambda n=name: _record_pods(kube, namespace, n) or None, 30, message=f"{name}'s record pod")
        configmap = kube.request("GET", kube.core_path(namespace, "configmaps", f"{name}-record-1"))
        owner = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "name": name,
                 "uid": done["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        assert pod["metadata"]["ownerReferences"] == configmap["metadata"]["ownerReferences"] == [owner]
        assert json.loads(configmap["data"]["status.json"])["phase"] == "Succeeded"
        policy = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/"
                              f"{name}-record-1")
        assert policy["metadata"]["ownerReferences"] == [owner] and "ingress" not in policy["spec"]  # none may reach it
        assert "Egress" in policy["spec"]["policyTypes"] and "169.254.0.0/16" in json.dumps(policy["spec"]["egress"])
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        spec = pod["spec"]
        (container,) = spec["containers"]
        assert container["command"][:4] == ["python", "-m", "rljob_trainer.tracking", "record"]
        assert "--mlflow-experiment" in container["command"] and "nvidia.com/gpu" not in json.dumps(container)
        assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 300
        assert [v["name"] for v in spec["volumes"]] == ["rljob-record", "rljob-tmp"]
        assert container["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
        annotate_pod(kube, namespace, pod["metadata"]["name"], {
            "rljob.dev/fake-exit-code": exit_code, "rljob.dev/fake-message": "rljob: ConnectionError: refused"})
    recorded = wait_exp(kube, namespace, "rec", lambda s: (_recorded(s) or {}).get("status") == "True",
                        "Recorded True", 60)
    assert (_recorded(recorded["status"]) or {})["reason"] == "Recorded"
    failed = wait_exp(kube, namespace, "rec-fails", lambda s: (_recorded(s) or {}).get("reason") == "RecordFailed",
                      "Recorded False, RecordFailed", 60)
    message = (_recorded(failed["status"]) or {})["message"]
    assert "exit code 1" in message and "ConnectionError" in message, message
    assert failed["status"]["phase"] == "Succeeded"  # the verdict stands
    # Once said, nothing is created again: a poke reconciles both, and each still has its one pod.
    for name in ("rec", "rec-fails"):
        seen = api_requests(op, "GET")
        kube.request("PATCH", exp_path(namespace, name), {"metadata": {"labels": {"poke": "1"}}},
                     content_type="application/merge-patch+json")
        wait_for(lambda s=seen: api_requests(op, "GET") > s, 30, message="a reconcile after the poke")
    assert [len(_record_pods(kube, namespace, n)) for n in ("rec", "rec-fails")] == [1, 1]


SEARCH = {"maxTrials": 3, "parallelism": 2, "algorithm": "random", "seed": 11, "parameters": [
    {"name": "training.learningRate", "type": "float", "min": 1e-5, "max": 0.01, "log": True}]}


def test_an_operator_killed_mid_experiment_resumes_it_with_no_duplicate_trial(
        kube: Any, experiment_crd: Any, namespace: str, operator: Any) -> None:
    """The first operator dies right after its first write (the status recording two trials and their
    parameters); the next creates exactly those trials, with those parameters, and no others."""
    crashing = operator(wait=False, leader_elect=False, env={"RLJOB_FAULT_CRASH_AFTER_WRITES": "1"})
    create(kube, namespace, experiment("search", search=SEARCH))
    crashing.wait_exit(60)
    recorded = get(kube, namespace, "search")["status"]["trials"]
    assert [t["name"] for t in recorded] == ["search-t0", "search-t1"]
    assert trial_jobs(kube, namespace, "search") == []  # died before creating any

    op = operator()
    jobs = wait_for(lambda: trials_when(kube, namespace, "search", 2), 60,
                    message="the recorded trials created")
    for job, trial in zip(jobs, recorded, strict=True):
        assert job["spec"]["training"]["learningRate"] == pytest.approx(trial["params"]["training.learningRate"])
    uids = {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs}
    # Restart again while both run, once their UIDs are recorded (before that, a restarted operator could not
    # tell them from a tenant's jobs of those names: test_a_tenants_forged_trial_is_a_conflict_and_never_ranked):
    # the same two jobs (same uids), no third while no slot is free.
    wait_exp(kube, namespace, "search", lambda s: {t["name"]: t.get("uid") for t in s.get("trials") or []} == uids,
             "the trials' UIDs recorded")
    op.kill()
    operator()
    wait_exp(kube, namespace, "search", lambda s: s.get("phase") == "Running", "experiment Running")
    assert {j["metadata"]["name"]: j["metadata"]["uid"] for j in trial_jobs(kube, namespace, "search")} == uids
    finish(kube, namespace, "search-t0")
    third = wait_for(lambda: trials_when(kube, namespace, "search", 3), 60,
                     message="the third trial once a slot freed")
    assert [j["metadata"]["name"] for j in third] == ["search-t0", "search-t1", "search-t2"]
    status = get(kube, namespace, "search")["status"]
    assert [t["params"] for t in status["trials"][:2]] == [t["params"] for t in recorded]
    assert len(status["trials"]) == 3


# ------------------------------------------------------------------------------ admission


@pytest.fixture
def experiment_policy(control_plane: Any, kube: Any, crd_installed: Any, experiment_crd: Any,
                      namespace: str) -> Any:
    """The kustomize base's admission policy as it ships, but for an operator running as
    ServiceAccount ``<namespace>:exp-operator`` (the shipped one names rljob-system:rljob-operator)."""
    from tests.delivery.test_admission_policies_cluster import (
        POLICY,
        POLICY_FILE,
        _delete_policy,
        _kubectl_admin,
    )

    text = POLICY_FILE.read_text().replace("system:serviceaccount:rljob-system:rljob-operator",
                                           f"system:serviceaccount:{namespace}:exp-operator")
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=text)
    try:
        yield POLICY
    finally:
        _delete_policy(kube)


def _role(control_plane: Any, namespace: str, name: str, rules: list[dict[str, Any]], subject: str) -> None:
    from tests.delivery.test_admission_policies_cluster import _role as role

    role(control_plane, namespace, name, rules, subject)


def test_an_experiment_cannot_launder_a_reference_its_creator_could_not_use(
        experiment_policy: str, control_plane: Any, kube: Any, namespace: str, service_account_kubeconfig: Any,
        tmp_path: Path) -> None:
    """An ordinary user (rights on experiments only) may not name, through an experiment's template or an arm,
    a ConfigMap they could not read (a reward module's), nor change the runtime in an arm; once allowed, the
    operator creates the trials."""
    from tests.delivery.test_admission_policies_cluster import _apply
    from tests.delivery.test_chart import run
    from tests.support.operator_process import OperatorProcess

    _role(control_plane, namespace, "experiments-only", [
        {"apiGroups": ["rljob.dev"], "resources": ["rlexperiments"], "verbs": ["get", "list", "create", "patch"]},
        {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["get", "list"]},
        # the platform's runtimes, by the shipped runtime-use policy (in force with the experiments' one)
        {"apiGroups": ["rljob.dev"], "resources": ["clusterrltrainingruntimes"], "verbs": ["use"]}], "alice")
    alice = service_account_kubeconfig("alice")
    sourced = [{"name": "team_rewards:score", "source": {"configMap": {"name": "team-rewards", "key": "r.py"}}}]
    doc = experiment("creds", arms=ARMS)
    doc["spec"]["template"] = deep_update(template(), {"training": {"rewards": sourced}})

    def refusal(d: dict[str, Any]) -> str:
        # A server-side dry run: admitted while the policy is not yet in force, nothing is stored (a stored
        # experiment would make later applies updates without a spec change, which the policy lets pass).
        result = run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(alice), "--namespace", namespace,
                      "create", "--dry-run=server", "-f", "-"], check=False, input=yaml.safe_dump(d))
        return result.stderr if result.returncode != 0 else ""

    wait_for(lambda: experiment_policy in refusal(doc), 60, message="the policy in force for experiments")
    assert ('spec.template.training.rewards[name=team_rewards:score].source.configMap.name names ConfigMap '
            '"team-rewards"') in refusal(doc)
    sneaky = experiment("sneaky", arms=[ARMS[0], {"name": "creds", "overrides": {"training": {"rewards": sourced}}}])
    assert "spec.arms[].overrides may not set" in refusal(sneaky)
    elsewhere = experiment("elsewhere", arms=[ARMS[0], {"name": "gpu", "overrides": {"runtimeRef": {"name": "x"}}}])
    assert "spec.arms[].overrides may not set runtimeRef" in refusal(elsewhere)

    # Allowed to read the Secret, alice's experiment is admitted, and the operator (which may read no
    # Secret) creates its trials: the template was checked against alice, not against the operator.
    _role(control_plane, namespace, "read-team-rewards", [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["team-rewards"], "verbs": ["get"]}], "alice")
    refused: list[str] = []
    try:
        wait_for(lambda: not refused.append(refusal(doc)) and not refused[-1], 30)
    except TimeoutError:
        raise AssertionError(f"alice's experiment still refused once she may read the ConfigMap: {refused[-1]}") from None
    created = _apply(control_plane, alice, namespace, doc)
    assert created.returncode == 0, created.stderr
    assert "spec.arms[].overrides may not set" in refusal(sneaky)  # still: arms never carry references
    _role(control_plane, namespace, "operator-rights", [
        {"apiGroups": ["rljob.dev"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods", "configmaps", "services", "events"], "verbs": ["*"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["*"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["*"]}], "exp-operator")
    # The platform's runtimes are cluster-scoped: a namespaced operator reads them through a ClusterRole.
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    kube.request("POST", f"{rbac}/clusterroles", {"metadata": {"name": f"{namespace}-runtimes"}, "rules": [
        {"apiGroups": ["rljob.dev"], "resources": ["clusterrltrainingruntimes"], "verbs": ["list", "watch"]}]})
    kube.request("POST", f"{rbac}/clusterrolebindings", {
        "metadata": {"name": f"{namespace}-runtimes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{namespace}-runtimes"},
        "subjects": [{"kind": "ServiceAccount", "name": "exp-operator", "namespace": namespace}]})
    op = OperatorProcess(service_account_kubeconfig("exp-operator"), namespace, tmp_path / "sa-operator.log").start()
    try:
        op.wait_leader()
        jobs = wait_for(lambda: trials_when(kube, namespace, "creds", 2), 60, message="alice's trials created")
        assert all([r.get("source") for r in j["spec"]["training"]["rewards"]] == [r["source"] for r in sourced]
                   for j in jobs)
    finally:
        op.stop()
