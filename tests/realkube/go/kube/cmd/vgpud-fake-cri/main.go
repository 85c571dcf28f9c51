// vgpud-fake-cri: a container runtime for a real kubelet in vgpud's tests. It serves both
// CRI services on a unix socket with k8s.io/cri-client's fake (sandboxes and containers are
// bookkeeping only, nothing runs) and appends every CreateContainer request it receives, as
// one protojson line, to the --record file: the envs, mounts, devices and CDI names kubelet
// composed from the device plugin's Allocate response, for a test to apply to a real runc
// container.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// recorder is the fake runtime with CreateContainer written down first.
type recorder struct {
	*fake.RemoteRuntime
	mu  sync.Mutex
	out *os.File
}

func (r *recorder) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	line, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("recording CreateContainer: %w", err)
	}
	r.mu.Lock()
	_, err = r.out.Write(append(line, '\n'))
	if err == nil {
		err = r.out.Sync()
	}
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("recording CreateContainer: %w", err)
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func main() {
	listen := flag.String("listen", "", "endpoint to serve, unix:///path/to/cri.sock")
	record := flag.String("record", "", "file that receives one JSON line per CreateContainer request")
	flag.Parse()
	if *listen == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "usage: vgpud-fake-cri --listen unix:///PATH --record FILE")
		os.Exit(2)
	}
	out, err := os.OpenFile(*record, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rt := &recorder{RemoteRuntime: fake.NewFakeRemoteRuntime(), out: out}
	// The fake's images have size 0 unless told otherwise, and kubelet's CRI client refuses
	// an image whose Id or Size is unset (cri-client remote_image.go, imageStatusV1): every
	// container would fail with ImageInspectError.
	rt.ImageService.SetFakeImageSize(1 << 20)
	rt.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, rt)
	kubeapi.RegisterImageServiceServer(server, rt)
	listener, err := util.CreateListener(*listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listening on %s: %v\n", *listen, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Printf("vgpud-fake-cri serving on %s, recording to %s\n", *listen, *record)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
