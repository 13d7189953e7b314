{{/* Chart name, possibly overridden. */}}
{{- define "tidegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: release-chart, or the release alone when it already contains the chart name. */}}
{{- define "tidegate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tidegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tidegate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "tidegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tidegate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding tokens and the database URL, or "" when there is none. */}}
{{- define "tidegate.secretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else if .Values.secrets.create }}
{{- include "tidegate.fullname" . }}
{{- end }}
{{- end }}

{{- define "tidegate.leaseName" -}}
{{- default (include "tidegate.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The Leases the daemon reads and writes by name, as a JSON list: the leader's Lease, or with
leaderElection.buckets > 1 one per bucket (controller.shards.bucket_lease_name) and the members Lease. */}}
{{- define "tidegate.leaseNames" -}}
{{- $name := include "tidegate.leaseName" . }}
{{- $n := int .Values.leaderElection.buckets }}
{{- if gt $n 1 }}
{{- $width := len (toString (sub $n 1)) }}
{{- $names := list (printf "%s-members" $name) }}
{{- range $i := until $n }}
{{- $names = append $names (printf "%s-bucket-%0*d-of-%d" $name $width $i $n) }}
{{- end }}
{{- toJson $names }}
{{- else }}
{{- toJson (list $name) }}
{{- end }}
{{- end }}

{{/* The leader election backend: leaderElection.backend, or lease when more than one pod runs. */}}
{{- define "tidegate.leaderBackend" -}}
{{- $backend := .Values.leaderElection.backend | default (ternary "lease" "none" (gt (int .Values.replicaCount) 1)) }}
{{- if and (eq $backend "none") (gt (int .Values.replicaCount) 1) }}
{{- fail "leaderElection.backend none with replicaCount > 1 would run several acting daemons: use lease (or database on PostgreSQL), or replicaCount 1" }}
{{- end }}
{{- if and (gt (int .Values.leaderElection.buckets) 1) (ne $backend "lease") }}
{{- fail "leaderElection.buckets > 1 shards models over Leases: set leaderElection.backend lease (or leave it empty with replicaCount > 1)" }}
{{- end }}
{{- $backend }}
{{- end }}

{{/* Namespaces the daemon scales Deployments in, as a list. */}}
{{- define "tidegate.managedNamespaces" -}}
{{- $ns := .Values.rbac.managedNamespaces | default (list .Release.Namespace) }}
{{- toJson (uniq $ns) }}
{{- end }}

{{/* The daemon config as the daemon reads it: the user's config plus what the chart owns (the API
address, the policies directory, and leader election from leaderElection.*, so that the Lease the
daemon takes is the one the Role grants). */}}
{{- define "tidegate.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "apiVersion" "tidegate/v1" }}
{{- $_ := set $cfg "kind" "DaemonConfig" }}
{{- $_ := set $cfg "policies_dir" "/etc/tidegate/policies" }}
{{- $api := deepCopy (default dict $cfg.api) }}
{{- $_ := set $api "enabled" true }}
{{- $_ := set $api "host" "0.0.0.0" }}
{{- $_ := set $api "port" (int .Values.service.port) }}
{{- $_ := set $cfg "api" $api }}
{{- $election := deepCopy (default dict $cfg.leader_election) }}
{{- $_ := set $election "backend" (include "tidegate.leaderBackend" .) }}
{{- $_ := set $election "name" (include "tidegate.leaseName" .) }}
{{- $_ := set $election "lease_namespace" .Release.Namespace }}
{{- $_ := set $election "lease_duration_s" (int .Values.leaderElection.leaseDurationSeconds) }}
{{- $_ := set $election "retry_period_s" .Values.leaderElection.retryPeriodSeconds }}
{{- $_ := set $election "buckets" (int .Values.leaderElection.buckets) }}
{{- $_ := set $cfg "leader_election" $election }}
{{- toYaml $cfg }}
{{- end }}

{{/* Where the daemon reaches Triton (config.providers.settings.triton), as JSON: "discovered"
the port on discovered pods (0 without discover), "namespaces" those of the model's Deployments,
"static" the ports of the static host:port endpoints. */}}
{{- define "tidegate.tritonEgress" -}}
{{- $triton := dig "providers" "settings" "triton" dict (.Values.config | default dict) | default dict }}
{{- $out := dict "discovered" 0 "namespaces" list "static" list }}
{{- if $triton.discover }}
{{- $_ := set $out "discovered" (int (default 8000 $triton.port)) }}
{{- $nss := list }}
{{- range .Values.config.models }}
{{- range $pool, $dep := .deployments }}
{{- $nss = append $nss (default "default" $dep.namespace) }}
{{- end }}
{{- end }}
{{- $_ := set $out "namespaces" ($nss | uniq | sortAlpha) }}
{{- end }}
{{- $ports := list }}
{{- range $model, $pools := (default dict $triton.replicas) }}
{{- range $pool, $endpoints := $pools }}
{{- range $endpoints }}
{{- $ports = append $ports (int (regexReplaceAll "^.*:" . "")) }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $out "static" ($ports | uniq | sortAlpha) }}
{{- toJson $out }}
{{- end }}
