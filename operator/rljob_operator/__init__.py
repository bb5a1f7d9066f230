"""rljob's operator: reconciles RLTrainingJob resources into torchrun gangs of GPU pods.

Importing this package, and ``rljob_operator.api``, must not import torch.

Modules, by responsibility (pure ones take no cluster and no clock):

* ``api`` (pure): the pydantic models, the single source of truth; ``crd`` (pure): the CRD from them.
* ``builders`` (pure): ConfigMap, headless Service and worker pods from a spec.
* ``status`` (pure): pods as observed, failure reasons, kstatus conditions.
* ``lifecycle`` (pure): one reconcile decided: (job, pods, now) → Plan.
* ``reconciler``: observe, decide, act, in an order that converges when interrupted.
* ``kube``: the JSON REST layer; ``handlers``: kopf watches feeding ``workqueue``.
* ``leader``: the Lease; ``statusapi``: heartbeats and status over HTTPS; ``tls``: its certificate.
* ``metrics``: Prometheus series and health; ``settings``: configuration; ``runner``: ``rljob operator``.
"""

__version__ = "0.1.0"
