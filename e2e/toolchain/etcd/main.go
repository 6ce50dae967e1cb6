// Command etcd is the etcd server from the pinned go.etcd.io/etcd/server/v3 module.
// The test bed builds it in its cache dir with a generated go.mod (see sluice/testbed/kube.py).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
