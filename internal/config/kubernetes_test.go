package config

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// k8sVolume is what the test reads of a pod's volume.
type k8sVolume struct {
	Name     string `yaml:"name"`
	EmptyDir any    `yaml:"emptyDir"`
	Secret   *struct {
		SecretName string `yaml:"secretName"`
		Items      []struct {
			Key string `yaml:"key"`
		} `yaml:"items"`
	} `yaml:"secret"`
}

// k8sContainer is what the test reads of a container.
type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom any    `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		ContainerPort int    `yaml:"containerPort"`
		Name          string `yaml:"name"`
	} `yaml:"ports"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path   string `yaml:"path"`
			Port   int    `yaml:"port"`
			Scheme string `yaml:"scheme"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sObject struct {
	Kind string            `yaml:"kind"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec struct {
				InitContainers []k8sContainer `yaml:"initContainers"`
				Containers     []k8sContainer `yaml:"containers"`
				Volumes        []k8sVolume    `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

// TestKubernetesManifestsStart keeps deploy/kubernetes startable: each container's environment
// (the shared ConfigMap and its own) loads as its binary would, its ports and readiness probe
// are the configured ones, every file the configuration names is on a mounted volume, the
// secrets key is not read straight from a Secret volume (kubelet leaves those files readable
// by the pod's fsGroup, and a key file readable by others stops the registry), and a pod
// gets the CA certificate and its own certificate and key, never the CA's key or another
// service's key.
func TestKubernetesManifestsStart(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "kubernetes", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var objects []k8sObject
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			objects = append(objects, o)
		}
	}
	var common []string
	for _, o := range objects {
		if o.Kind == "ConfigMap" {
			for k, v := range o.Data {
				common = append(common, k+"="+v)
			}
		}
	}
	require.NotEmpty(t, common, "the shared ConfigMap")

	pods := 0
	for _, o := range objects {
		spec := o.Spec.Template.Spec
		for _, c := range spec.Containers {
			binary := path.Base(c.Command[0])
			pods++
			t.Run(binary, func(t *testing.T) {
				env := append([]string(nil), common...)
				for _, e := range c.Env {
					v := e.Value
					if e.ValueFrom != nil {
						v = strings.Repeat("ab", 32) // from a Secret: what the operator supplies
					}
					env = append(env, e.Name+"="+v)
				}
				cfg, err := Load(binary, nil, env, io.Discard)
				require.NoError(t, err)
				require.True(t, cfg.IsProduction())

				ports := map[string]int{}
				for _, p := range c.Ports {
					ports[p.Name] = p.ContainerPort
				}
				for name, addr := range map[string]string{"grpc": cfg.GRPCAddr, "http": cfg.HTTPAddr, "internal": cfg.InternalAddr} {
					_, port, err := net.SplitHostPort(addr)
					require.NoError(t, err)
					require.Equal(t, port, strconv.Itoa(ports[name]), "containerPort %s is %s's port", name, addr)
				}
				probe := c.ReadinessProbe.HTTPGet
				require.Equal(t, "/healthz", probe.Path)
				require.Equal(t, ports["http"], probe.Port, "the probe asks the HTTP port")
				require.Equal(t, "HTTPS", probe.Scheme, "with TLS set the HTTP port serves HTTPS")

				volumes := map[string]k8sVolume{}
				for _, v := range spec.Volumes {
					volumes[v.Name] = v
				}
				for _, v := range o.Spec.VolumeClaimTemplates {
					volumes[v.Metadata.Name] = k8sVolume{Name: v.Metadata.Name}
				}
				// volumeOf is the volume a file is read from, and the file's name on it.
				volumeOf := func(file string) (k8sVolume, string) {
					for _, m := range c.VolumeMounts {
						if rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/"); ok {
							v, ok := volumes[m.Name]
							require.True(t, ok, "volume %s of mount %s", m.Name, m.MountPath)
							return v, rel
						}
					}
					t.Fatalf("%s is on no volume the container mounts", file)
					return k8sVolume{}, ""
				}
				for _, file := range []string{cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.ClientCAFile, cfg.Store.EtcdCAFile, cfg.Store.EtcdCertFile, cfg.Store.EtcdKeyFile, cfg.SecretsKeyFile, cfg.DataDir + "/x"} {
					if file == "" || file == "/x" {
						continue
					}
					v, name := volumeOf(file)
					if v.Secret != nil && len(v.Secret.Items) > 0 {
						var keys []string
						for _, it := range v.Secret.Items {
							keys = append(keys, it.Key)
						}
						require.Contains(t, keys, name, "%s: the Secret volume %s projects it", file, v.Name)
					}
				}
				if cfg.SecretsKeyFile != "" {
					v, _ := volumeOf(cfg.SecretsKeyFile)
					require.Nil(t, v.Secret, "secrets_key_file %s is on a Secret volume, whose files kubelet leaves readable by the fsGroup: the registry refuses a key file others can read", cfg.SecretsKeyFile)
				}

				service := strings.TrimPrefix(binary, "ringfence-")
				v, _ := volumeOf(cfg.TLS.KeyFile)
				require.NotNil(t, v.Secret, "the certificates come from a Secret")
				var keys []string
				for _, it := range v.Secret.Items {
					keys = append(keys, it.Key)
				}
				require.ElementsMatch(t, []string{"ca.pem", service + ".pem", service + "-key.pem"}, keys,
					"the pod gets the CA certificate and its own certificate and key only: with the CA's key or another service's key it could pass for any service")
			})
		}
	}
	require.Equal(t, 3, pods, "registry, publisher and audit")
}
