// Command webhook runs cert-manager's admission webhook (validation and defaulting of
// cert-manager.io and acme.cert-manager.io resources, CertificateRequest identity and approval
// checks) for the test harness, built by hack/build-tools.sh.
//
// cert-manager's own cmd/webhook is a separate Go module that upstream does not tag, so the Go
// module proxy does not serve it; this stand-in parses the same flags (pkg/webhook/options) and
// runs the same server (internal/webhook.NewCertManagerWebhookServer). It sits in a module
// under github.com/cert-manager/cert-manager/ because that server is an internal package of
// that tree, as it is for upstream's cmd modules. No --config file: flags only.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
	"github.com/cert-manager/cert-manager/pkg/webhook/options"
)

func main() {
	logf.InitLogs()
	defer logf.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager webhook: %v\n", err)
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg, err := options.NewWebhookConfiguration()
	if err != nil {
		return fmt.Errorf("default configuration: %w", err)
	}
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	options.AddConfigFlags(fs, cfg)
	version := fs.Bool("version", false, "print cert-manager's version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(util.AppVersion)
		return nil
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if err := logf.ValidateAndApply(&cfg.Logging); err != nil {
		return fmt.Errorf("logging: %w", err)
	}
	log := logf.FromContext(ctx, "webhook")
	log.Info("starting cert-manager webhook", "version", util.AppVersion)
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		return fmt.Errorf("webhook server: %w", err)
	}
	return srv.Run(ctx)
}
