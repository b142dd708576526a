// Command etcd is etcd's own server main, built from the Go module proxy at the
// version Kubernetes pins, so the local control plane needs no release download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
