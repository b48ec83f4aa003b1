// Added to sigs.k8s.io/kube-network-policies' cmd/ by hack/build-tools.sh (build_netpol): a
// --kubeconfig flag, so the enforcer runs as a process beside a test node's kubelet with the
// harness's admin kubeconfig. Upstream's main only knows the in-cluster configuration (the
// token and CA a DaemonSet's pod has); without the flag this build still uses it.

package main

import (
	"flag"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var kubeconfig string

func init() {
	flag.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig (etcd-operator's test harness); in-cluster configuration when empty")
}

// restConfig is what main's rest.InClusterConfig() call is replaced by.
func restConfig() (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
