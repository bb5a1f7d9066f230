"""rljob's operator: reconciles RLTrainingJob resources into torchrun gangs of GPU pods.

Importing this package, and ``rljob_contract.job``, must not import torch.

Modules, by responsibility (pure ones take no cluster and no clock):

* ``rljob_contract`` (pure, outside this package): the pydantic models, the single source of truth;
  ``crd`` (pure): the CRDs from them.
* ``decisions/`` (pure): ``children`` (ConfigMap, headless Service and worker pods from a spec),
  ``observed`` (pods as observed), ``conditions`` (kstatus), ``plan`` (Plan and the one status
  builder), ``situation`` + ``lifecycle`` (one reconcile decided as named steps: (job, pods, now) →
  Plan), ``failure/`` (the failure step, one module per step: observe → classify → respond → record),
  ``refusals`` (a refused create → Plan), ``scaling``.
* ``cluster/reconciler``: observe, decide, apply the Plan, in an order that converges when interrupted.
* ``kube``: the JSON REST layer; ``streams``: the watches, whose subscribers (``handlers``) feed ``workqueue``.
* ``leader``: the Lease; ``statusapi``: heartbeats and status over HTTPS; ``tls``: its certificate.
* ``metrics``: Prometheus series and health; ``settings``: configuration; ``runner``: ``rljob operator``.
* ``kubeimport``: the Kubernetes client's packages imported name by name, on first use.
"""

from rljob_contract.version import VERSION

from rljob_operator import kubeimport

kubeimport.install()  # before any module of this package imports the Kubernetes client

__version__ = VERSION
