"""A real Kubernetes control plane on 127.0.0.1, built from published Go modules.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the Kueue and
JobSet controllers with their webhooks, and kwok for GPU nodes with no kubelet.
``deploy/cluster/versions.env`` pins every version. Nothing here runs a
container: kwok's stages move each pod through its phases.
"""
