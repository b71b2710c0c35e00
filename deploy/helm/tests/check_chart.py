"""Checks the gpufuse Helm chart without a cluster (run by scripts/check-helm-chart.sh).

- `helm lint` (strict), through Helm's own Go SDK (helm-python-sdk's libhelm_c).
- Renders the chart for several value sets with Helm's engine and validates every object
  against the Kubernetes 1.34 OpenAPI schemas, strictly (unknown fields are errors), with
  kubernetes-validate. The one kind those schemas lack, Prometheus' ServiceMonitor, is checked
  for the fields Prometheus needs.
- The CRDs (crds/) validate as CustomResourceDefinitions, and the examples in examples/k8s
  validate: GPUPool/GPUQuota against the CRDs' own schemas, the rest against Kubernetes'.
- The webhook sends pods to the controller by default (the nodes then need a TCP listener);
  without the controller, a webhook without its server address refuses to render.

Prints one line per check and a closing `N passed, M failed`; exits non-zero on a failure.
"""
from __future__ import annotations

import pathlib
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy/helm/gpufuse"
EXAMPLES = ROOT / "examples/k8s"
KUBE = "1.34.0"

passed = 0
failed = 0


def check(name: str, fn) -> None:
    global passed, failed
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        failed += 1
        print(f"FAIL {name}: {e}")
    else:
        passed += 1
        print(f"ok   {name}")


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def validate_k8s(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBE, strict=True)


def validate_service_monitor(obj: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
    spec = obj["spec"]
    assert spec["selector"]["matchLabels"], "the ServiceMonitor selects no Service"
    for e in spec["endpoints"]:
        assert e["port"] and e["path"] == "/metrics", e


VALUE_SETS = {
    "defaults": {},
    "everything": {
        "webhook": {"enabled": True},
        "nodeTcpPort": 7070,
        "metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "node": {"devices": "emu:2:16GiB", "nodeSelector": {"gpufuse.dev/node": "true"},
                 "runtimeClassName": "nvidia",
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                 "resources": {"limits": {"memory": "4Gi"}}},
        "tokenSecret": "00" * 32,
    },
    "node only": {"controller": {"enabled": False}, "deviceClass": {"enabled": False}},
}

EXPECTED = {
    "defaults": {"DaemonSet", "Deployment", "DeviceClass", "ClusterRole", "ClusterRoleBinding",
                 "ServiceAccount", "Secret"},
    "everything": {"MutatingWebhookConfiguration", "ServiceMonitor", "Service"},
    "node only": {"DaemonSet"},
}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="gpufuse", namespace="gpufuse", is_install=True)
    objects = []
    for path, text in sorted(out.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(docs(text))
    return objects


def check_values(label: str, values: dict) -> None:
    objects = render(values)
    kinds = {o["kind"] for o in objects}
    missing = EXPECTED[label] - kinds
    assert not missing, f"{label}: no {sorted(missing)} rendered (got {sorted(kinds)})"
    if label == "node only":
        assert "DeviceClass" not in kinds and "Deployment" not in kinds, sorted(kinds)
    for o in objects:
        where = f"{o['kind']}/{o['metadata']['name']}"
        try:
            if o["kind"] == "ServiceMonitor":
                validate_service_monitor(o)
            else:
                validate_k8s(o)
        except Exception as e:
            raise AssertionError(f"{where}: {e}") from None
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all", env
    check_node_joins_pool(label, objects, pod)
    if label == "everything":
        args = pod["containers"][0]["args"]
        assert "--http=0.0.0.0:9400" in args and "--listen=tcp:0.0.0.0:7070" in args, args
        assert pod.get("runtimeClassName") == "nvidia", pod.get("runtimeClassName")
    else:
        assert "runtimeClassName" not in pod, pod["runtimeClassName"]


def check_node_joins_pool(label: str, objects: list[dict], pod: dict) -> None:
    """With the controller, the node is `gpufuse node --kubernetes` registered with the
    controller's Service, named spec.nodeName, allowed to read its Node; without, `serve`."""
    node = pod["containers"][0]
    args = node["args"]
    if label == "node only":
        assert args[0] == "serve", args
        return
    assert args[:2] == ["node", "--kubernetes"], args
    service = next(o for o in objects if o["kind"] == "Service"
                   and o["metadata"]["name"] == "gpufuse-controller")
    port = service["spec"]["ports"][0]["port"]
    want = f"--controller=tcp:gpufuse-controller.gpufuse.svc:{port}"
    assert want in args, (want, args)
    assert "--token-secret-file=/etc/gpufuse/token/secret" in args, args
    assert any(a.startswith("--cdi-dir=") for a in args), args
    env = {e["name"]: e for e in node.get("env", [])}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", env
    if label == "everything":
        assert "--advertise=tcp:$(POD_IP):7070" in args, args
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", env
    else:
        assert not any(a.startswith("--advertise") for a in args), args
    role = next(o for o in objects if o["kind"] == "ClusterRole"
                and o["metadata"]["name"] == "gpufuse-node")
    assert any("nodes" in r["resources"] and "get" in r["verbs"] for r in role["rules"]), role


def lint() -> None:
    report = helm.lint(str(CHART), strict=True, kube_version="v1.34.0")
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    assert not report.get("errors") and not problems, report


def refuses_to_render(values: dict, message: str) -> None:
    try:
        render(values)
    except helm.HelmError as e:
        assert message in str(e), e
    else:
        raise AssertionError(f"{values} rendered")


def webhook_needs_a_server() -> None:
    """Without the controller, the webhook needs webhook.server; with it, the controller is
    the default, and the nodes need a TCP listener for the pods it sends them."""
    refuses_to_render({"webhook": {"enabled": True}, "controller": {"enabled": False}},
                      "webhook.server must be set")
    refuses_to_render({"webhook": {"enabled": True}}, "set nodeTcpPort")
    objects = render({"webhook": {"enabled": True}, "nodeTcpPort": 7070})
    hook = next(o for o in objects if o["kind"] == "Deployment"
                and o["metadata"]["name"] == "gpufuse-webhook")
    args = hook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--server=tcp:gpufuse-controller.gpufuse.svc:7070" in args, args


def crds() -> dict[str, dict]:
    found = {}
    for f in sorted((CHART / "crds").glob("*.yaml")):
        for crd in docs(f.read_text()):
            validate_k8s(crd)
            found[crd["spec"]["names"]["kind"]] = crd
    assert set(found) == {"GPUPool", "GPUQuota"}, sorted(found)
    return found


def examples() -> None:
    schemas = {k: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for k, c in crds().items()}
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files, f"no examples in {EXAMPLES}"
    count = 0
    for f in files:
        for o in docs(f.read_text()):
            count += 1
            where = f"{f.name}: {o['kind']}/{o['metadata']['name']}"
            try:
                if o["kind"] in schemas:
                    jsonschema.validate(o, schemas[o["kind"]])
                else:
                    validate_k8s(o)
            except Exception as e:
                raise AssertionError(f"{where}: {e}") from None
    assert count >= 4, count


def main() -> int:
    check("helm lint --strict", lint)
    for label, values in VALUE_SETS.items():
        check(f"render ({label}) validates against Kubernetes {KUBE}",
              lambda v=values, l=label: check_values(l, v))
    check("the webhook's server: the controller by default, else webhook.server",
          webhook_needs_a_server)
    check("CRDs validate as CustomResourceDefinitions", crds)
    check("examples/k8s validate (CRD schemas and Kubernetes')", examples)
    print(f"helm {helm.helm_sdk_version()}, kubernetes-validate {kubernetes_validate.version.__version__ if hasattr(kubernetes_validate.version, '__version__') else ''}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
