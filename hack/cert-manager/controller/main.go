// Command controller runs cert-manager's controllers (the github.com/cert-manager/cert-manager
// module's pkg/controller registry) for the test harness, built by hack/build-tools.sh.
//
// cert-manager's own cmd/controller is a separate Go module that upstream does not tag, so
// the Go module proxy does not serve it; this is the harness's small stand-in for its start-up
// code: cert-manager's controller registry, the same controller selection (--controllers) and
// shared informers, with the defaults of cert-manager's ControllerConfiguration
// (internal/apis/config/controller/v1alpha1/defaults.go of v1.21.2, copied into the flags and
// contextFactory).
// It sits in a module under github.com/cert-manager/cert-manager/ because some packages it
// needs are internal to that tree, as they are for upstream's cmd modules.
//
// Left out: the Venafi issuer (its client, github.com/Venafi/vcert/v5, is not served by the
// Go module proxy: 403 "not available"), and with it cert-manager's configuration package,
// which imports every controller; leader election and the profiler (the harness runs one
// replica). Metrics and healthz are served.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/cert-manager/cert-manager/internal/controller/feature"
	cm "github.com/cert-manager/cert-manager/pkg/apis/certmanager"
	"github.com/cert-manager/cert-manager/pkg/controller"
	challenges "github.com/cert-manager/cert-manager/pkg/controller/acmechallenges"
	orders "github.com/cert-manager/cert-manager/pkg/controller/acmeorders"
	shimingresses "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/ingresses"
	cracme "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/acme"
	crapprover "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	crvault "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/vault"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	certmetrics "github.com/cert-manager/cert-manager/pkg/controller/certificates/metrics"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	csracme "github.com/cert-manager/cert-manager/pkg/controller/certificatesigningrequests/acme"
	csrca "github.com/cert-manager/cert-manager/pkg/controller/certificatesigningrequests/ca"
	csrselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificatesigningrequests/selfsigned"
	csrvault "github.com/cert-manager/cert-manager/pkg/controller/certificatesigningrequests/vault"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	dnsutil "github.com/cert-manager/cert-manager/pkg/issuer/acme/dns/util"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	// The issuer implementations register themselves with pkg/issuer's factory.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/acme"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/vault"
)

func main() {
	logf.InitLogs()
	defer logf.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager controller: %v\n", err)
		logf.FlushLogs()
		os.Exit(1)
	}
}

// defaultControllers are cert-manager's DefaultEnabledControllers less Venafi's.
var defaultControllers = []string{
	issuers.ControllerName,
	clusterissuers.ControllerName,
	certmetrics.ControllerName,
	shimingresses.ControllerName,
	orders.ControllerName,
	challenges.ControllerName,
	cracme.CRControllerName,
	crapprover.ControllerName,
	crca.CRControllerName,
	crselfsigned.CRControllerName,
	crvault.CRControllerName,
	trigger.ControllerName,
	issuing.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
}

// csrControllers are cert-manager's experimental CertificateSigningRequest controllers (feature
// gate ExperimentalCertificateSigningRequestControllers) less Venafi's; all are cluster-scoped.
var csrControllers = []string{
	csracme.CSRControllerName,
	csrca.CSRControllerName,
	csrselfsigned.CSRControllerName,
	csrvault.CSRControllerName,
}

// config is what the flags set; the defaults are cert-manager's.
type config struct {
	kubeconfig               string
	namespace                string
	clusterResourceNamespace string
	leaderElect              bool
	controllers              []string
	workers                  int
	qps                      float32
	burst                    int
	certificateOwnerRef      bool
	metricsAddress           string
	healthzAddress           string
	featureGates             map[string]bool
	logging                  logsapi.LoggingConfiguration
	version                  bool
}

func run(ctx context.Context, args []string) error {
	cfg := config{featureGates: map[string]bool{}}
	logsapi.SetRecommendedLoggingConfiguration(&cfg.logging)
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "path to the kubeconfig of the API server")
	fs.StringVar(&cfg.namespace, "namespace", "", "only watch this namespace (all when empty)")
	fs.StringVar(&cfg.clusterResourceNamespace, "cluster-resource-namespace", "kube-system", "namespace of the Secrets ClusterIssuers refer to")
	fs.BoolVar(&cfg.leaderElect, "leader-elect", false, "leader election (only false: this build runs one replica)")
	fs.StringSliceVar(&cfg.controllers, "controllers", []string{"*"}, "controllers to run: '*' (the defaults), 'name' to add one, '-name' to leave one out")
	fs.IntVar(&cfg.workers, "concurrent-workers", 5, "workers per controller")
	fs.Float32Var(&cfg.qps, "kube-api-qps", 20, "client QPS without API Priority and Fairness")
	fs.IntVar(&cfg.burst, "kube-api-burst", 50, "client burst without API Priority and Fairness")
	fs.BoolVar(&cfg.certificateOwnerRef, "enable-certificate-owner-ref", false, "make each Certificate the owner of its Secret")
	fs.StringVar(&cfg.metricsAddress, "metrics-listen-address", "0.0.0.0:9402", "metrics address ('0' disables)")
	fs.StringVar(&cfg.healthzAddress, "healthz-listen-address", "0.0.0.0:9403", "address of /livez")
	fs.Var(cliflag.NewMapStringBool(&cfg.featureGates), "feature-gates", "key=value pairs of cert-manager feature gates")
	fs.BoolVar(&cfg.version, "version", false, "print cert-manager's version and exit")
	logf.AddFlags(&cfg.logging, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.version {
		fmt.Println(util.AppVersion)
		return nil
	}
	if cfg.leaderElect {
		return errors.New("--leader-elect=true is not supported by this build")
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.featureGates); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if err := logf.ValidateAndApply(&cfg.logging); err != nil {
		return fmt.Errorf("logging: %w", err)
	}
	enabled, err := enabledControllers(cfg.controllers, cfg.namespace)
	if err != nil {
		return err
	}
	log := logf.FromContext(ctx, "controller")
	log.Info("starting cert-manager controller", "version", util.AppVersion, "controllers", sets.List(enabled))

	factory, err := contextFactory(ctx, &cfg)
	if err != nil {
		return err
	}
	cctx, err := factory.Build()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)

	healthzLn, err := net.Listen("tcp", cfg.healthzAddress)
	if err != nil {
		return fmt.Errorf("healthz listener on %s: %w", cfg.healthzAddress, err)
	}
	// cert-manager's default leader-election healthz timeout (unused without leader election).
	healthzServer := healthz.NewServer(20 * time.Second)
	g.Go(func() error { return healthzServer.Start(ctx, healthzLn) })

	if cfg.metricsAddress != "0" {
		metricsLn, err := net.Listen("tcp", cfg.metricsAddress)
		if err != nil {
			return fmt.Errorf("metrics listener on %s: %w", cfg.metricsAddress, err)
		}
		metricsServer := cctx.Metrics.NewServer(metricsLn)
		g.Go(func() error {
			if err := metricsServer.Serve(metricsLn); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return metricsServer.Shutdown(shutdownCtx) //nolint:contextcheck // the root context is done
		})
	}

	known := controller.Known()
	for _, name := range sets.List(enabled) {
		construct, ok := known[name]
		if !ok {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("controller %s is not in this build", name)
		}
		iface, err := construct(factory)
		if err != nil {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("constructing controller %s: %w", name, err)
		}
		g.Go(func() error {
			log.V(logf.InfoLevel).Info("starting controller", "controller", name)
			return iface.Run(cfg.workers, ctx)
		})
	}
	cctx.SharedInformerFactory.Start(ctx.Done())
	cctx.KubeSharedInformerFactory.Start(ctx.Done())
	cctx.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	err = g.Wait()
	cctx.SharedInformerFactory.Shutdown()
	cctx.KubeSharedInformerFactory.Shutdown()
	cctx.HTTP01ResourceMetadataInformersFactory.Shutdown()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("control loops exited")
	return nil
}

// enabledControllers applies --controllers ('*', 'name', '-name') as cert-manager does;
// cluster-scoped controllers are left out when a namespace is set.
func enabledControllers(controllers []string, namespace string) (sets.Set[string], error) {
	enabled := sets.New[string]()
	var disabled []string
	for _, c := range controllers {
		switch {
		case c == "*":
			enabled.Insert(defaultControllers...)
		case strings.HasPrefix(c, "-"):
			disabled = append(disabled, strings.TrimPrefix(c, "-"))
		default:
			enabled.Insert(c)
		}
	}
	if utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalCertificateSigningRequestControllers) {
		enabled.Insert(csrControllers...)
	}
	enabled.Delete(disabled...)
	if namespace != "" {
		enabled.Delete(clusterissuers.ControllerName)
		enabled.Delete(csrControllers...)
	}
	known := sets.New(slices.Collect(maps.Keys(controller.Known()))...)
	if unknown := enabled.Difference(known); unknown.Len() > 0 {
		return nil, fmt.Errorf("unknown controllers %v (known: %v)", sets.List(unknown), sets.List(known))
	}
	return enabled, nil
}

// contextFactory builds the controllers' shared context with cert-manager's defaults for what
// the flags do not set (ACME HTTP-01 solver resources, DNS-01 checks, ingress-shim, backoff).
func contextFactory(ctx context.Context, cfg *config) (*controller.ContextFactory, error) {
	quantity := func(s string) resource.Quantity { return resource.MustParse(s) }
	return controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         cfg.kubeconfig,
		KubernetesAPIQPS:   cfg.qps,
		KubernetesAPIBurst: cfg.burst,
		Namespace:          cfg.namespace,
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace:        cfg.clusterResourceNamespace,
			ClusterIssuerAmbientCredentials: true,
			IssuerAmbientCredentials:        false,
		},
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverImage:                 "quay.io/jetstack/cert-manager-acmesolver:" + util.AppVersion,
			HTTP01SolverResourceRequestCPU:    quantity("10m"),
			HTTP01SolverResourceRequestMemory: quantity("64Mi"),
			HTTP01SolverResourceLimitsCPU:     quantity("100m"),
			HTTP01SolverResourceLimitsMemory:  quantity("64Mi"),
			ACMEHTTP01SolverRunAsNonRoot:      true,
			DNS01CheckAuthoritative:           true,
			DNS01Nameservers:                  dnsutil.RecursiveNameservers,
			DNS01CheckRetryPeriod:             10 * time.Second,
		},
		IngressShimOptions: controller.IngressShimOptions{
			DefaultIssuerKind:                 "Issuer",
			DefaultIssuerGroup:                cm.GroupName,
			DefaultAutoCertificateAnnotations: []string{"kubernetes.io/tls-acme"},
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef:                           cfg.certificateOwnerRef,
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
		SchedulerOptions: controller.SchedulerOptions{
			MaxConcurrentChallenges: 60,
		},
	})
}
