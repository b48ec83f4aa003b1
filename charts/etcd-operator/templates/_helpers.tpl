{{/*
Names. The prefix is at most 45 characters, so `<prefix>-webhook-metrics` stays a valid
Service name (DNS-1035 label, 63 characters).
*/}}
{{- define "etcd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 45 | trimSuffix "-" }}
{{- end }}

{{- define "etcd-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the cluster-scoped objects (ClusterRole, ClusterRoleBinding, webhook
configurations): the prefix and the release namespace, so two releases of the same name in
two namespaces do not collide.
*/}}
{{- define "etcd-operator.clusterName" -}}
{{- printf "%s-%s" (include "etcd-operator.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "etcd-operator.controller.fullname" -}}
{{- printf "%s-controller" (include "etcd-operator.fullname" .) }}
{{- end }}

{{- define "etcd-operator.webhook.fullname" -}}
{{- printf "%s-webhook" (include "etcd-operator.fullname" .) }}
{{- end }}

{{/* Secret holding the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "etcd-operator.webhook.secretName" -}}
{{- printf "%s-webhook-tls" (include "etcd-operator.fullname" .) }}
{{- end }}

{{/* The Lease of the controller's leader election. */}}
{{- define "etcd-operator.controller.leaseName" -}}
{{- printf "%s-controller" (include "etcd-operator.fullname" .) }}
{{- end }}

{{- define "etcd-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "etcd-operator.labels" -}}
helm.sh/chart: {{ include "etcd-operator.chart" . }}
app.kubernetes.io/name: {{ include "etcd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: etcd-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component: include with (list $ "controller"). */}}
{{- define "etcd-operator.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "etcd-operator.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Labels of a component's objects: include with (list $ "controller"). */}}
{{- define "etcd-operator.componentLabels" -}}
{{ include "etcd-operator.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* An image reference: include with (list $ .Values.controller.image). */}}
{{- define "etcd-operator.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/* Pod Security Standard "restricted", pod level. */}}
{{- define "etcd-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Pod Security Standard "restricted", container level. */}}
{{- define "etcd-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The DNS names of the webhook Service, then any extra names and the URL's host. */}}
{{- define "etcd-operator.webhook.dnsNames" -}}
{{- $svc := include "etcd-operator.webhook.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) -}}
{{- $names = concat $names .Values.webhook.certificates.extraDNSNames -}}
{{- $host := include "etcd-operator.webhook.urlHost" . -}}
{{- if and $host (not (include "etcd-operator.isIP" $host)) -}}
{{- $names = append $names $host -}}
{{- end -}}
{{- toJson (uniq $names) }}
{{- end }}

{{/* The IP addresses of the serving certificate: extra ones and the URL's host if an IP. */}}
{{- define "etcd-operator.webhook.ipAddresses" -}}
{{- $ips := .Values.webhook.certificates.extraIPAddresses -}}
{{- $host := include "etcd-operator.webhook.urlHost" . -}}
{{- if and $host (include "etcd-operator.isIP" $host) -}}
{{- $ips = append $ips $host -}}
{{- end -}}
{{- toJson (uniq $ips) }}
{{- end }}

{{/* The host of webhook.clientConfig.url, without brackets or port; empty without a URL. */}}
{{- define "etcd-operator.webhook.urlHost" -}}
{{- with .Values.webhook.clientConfig.url -}}
{{- (urlParse .).hostname | default "" -}}
{{- end -}}
{{- end }}

{{/* "true" if the argument looks like an IPv4 or IPv6 address, else empty. */}}
{{- define "etcd-operator.isIP" -}}
{{- if or (regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$" .) (regexMatch "^[0-9a-fA-F:]*:[0-9a-fA-F:.]*$" .) -}}
true
{{- end -}}
{{- end }}

{{/* The clientConfig of a webhook: include with (list $ "/validate"). */}}
{{- define "etcd-operator.webhook.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- with $root.Values.webhook.clientConfig.url }}
url: {{ printf "%s%s" (trimSuffix "/" .) $path | quote }}
{{- else }}
service:
  name: {{ include "etcd-operator.webhook.fullname" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ $path }}
  port: {{ $root.Values.webhook.service.port }}
{{- end }}
{{- end }}

{{/* What cert-manager mode and the Prometheus Operator objects need from the cluster. */}}
{{- define "etcd-operator.checkCapabilities" -}}
{{- if and (eq .Values.webhook.certificates.mode "cert-manager") (not (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}
{{- fail "webhook.certificates.mode=cert-manager needs cert-manager (the cluster does not serve cert-manager.io/v1): install cert-manager first, use webhook.certificates.mode=self-signed, or pass --api-versions cert-manager.io/v1 to helm template" }}
{{- end }}
{{- range $value, $kind := dict "serviceMonitor" "ServiceMonitor" "podMonitor" "PodMonitor" "prometheusRule" "PrometheusRule" }}
{{- if and (get $.Values.metrics $value).enabled (not ($.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind))) }}
{{- fail (printf "metrics.%s.enabled=true needs the Prometheus Operator's CRDs (the cluster does not serve monitoring.coreos.com/v1 %s): install them, set metrics.%s.enabled=false, or pass --api-versions monitoring.coreos.com/v1/%s to helm template" $value $kind $value $kind) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The host part of the servers' listen addresses: the pod IP with bindPodIP, else empty
     (every address). */}}
{{- define "etcd-operator.bindHost" -}}
{{- if .Values.bindPodIP -}}$(POD_IP){{- end -}}
{{- end }}

{{/* The POD_IP variable the listen addresses use with bindPodIP (an env list item). */}}
{{- define "etcd-operator.podIPEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
