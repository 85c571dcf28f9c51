// cdicheck: resolve CDI device names with the CDI library container runtimes use
// (tags.cncf.io/container-device-interface, as containerd and CRI-O do) and print the
// container edits they produce.
//
//	cdicheck SPEC_DIR NAME...   -> JSON {"env": [...], "mounts": [...], "devices": [...]}
package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: cdicheck SPEC_DIR NAME...")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1]), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cache:", err)
		os.Exit(1)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		fmt.Fprintln(os.Stderr, "spec errors:", errs)
		os.Exit(1)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, os.Args[2:]...); err != nil {
		fmt.Fprintln(os.Stderr, "inject:", err, unresolved)
		os.Exit(1)
	}
	out := map[string]any{"env": spec.Process.Env, "mounts": spec.Mounts, "devices": spec.Linux.Devices}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
