// Command fake-device-plugin advertises N devices of one extended resource (nvidia.com/gpu by default)
// to the kubelet through the device-plugin gRPC API, as NVIDIA's plugin does on a GPU node, so the
// node's capacity, the scheduler's accounting and the kubelet's admission all see them.  There is no
// hardware behind the devices: Allocate hands the container NVIDIA_VISIBLE_DEVICES with the ids it got,
// which is what the real plugin's environment strategy does.
//
// The kubelet deletes plugin sockets when it restarts; the plugin then serves again and re-registers.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; the devices never change health, so the stream then only
// waits for the kubelet to hang up.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func serve(dir, socketName string, p *plugin) (*grpc.Server, error) {
	path := filepath.Join(dir, socketName)
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}

func register(dir, socketName, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     socketName,
		ResourceName: resource,
	})
	return err
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 2, "number of devices")
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	prefix := flag.String("id-prefix", "GPU-fake-", "device id prefix")
	flag.Parse()

	p := &plugin{}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s%d", *prefix, i), Health: pluginapi.Healthy})
	}
	socketName := "fake-" + strings.NewReplacer("/", "-", ".", "-").Replace(*resource) + ".sock"
	socketPath := filepath.Join(*dir, socketName)
	var srv *grpc.Server
	for {
		// (re)start when our socket is gone: first run, or the kubelet restarted and wiped the directory
		if _, err := os.Stat(socketPath); err != nil {
			if srv != nil {
				srv.Stop()
			}
			if srv, err = serve(*dir, socketName, p); err != nil {
				log.Printf("serving %s: %v", socketPath, err)
				time.Sleep(time.Second)
				continue
			}
			for {
				if err := register(*dir, socketName, *resource); err != nil {
					log.Printf("registering with the kubelet: %v (retrying)", err)
					time.Sleep(time.Second)
					continue
				}
				break
			}
			log.Printf("registered %d x %s at %s", *count, *resource, socketPath)
		}
		time.Sleep(2 * time.Second)
	}
}
