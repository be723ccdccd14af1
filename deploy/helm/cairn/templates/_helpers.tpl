{{- define "cairn.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cairn.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cairn.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cairn.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag must name a release, not latest" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "cairn.jwtSecretName" -}}
{{- .Values.jwt.existingSecret | default (printf "%s-jwt" (include "cairn.fullname" .)) -}}
{{- end -}}

{{/* The pod template shared by the StatefulSet (embedded) and the Deployment (cluster). */}}
{{- define "cairn.pod" -}}
metadata:
  labels:
    {{- include "cairn.selector" . | nindent 4 }}
  {{- if or .Values.podAnnotations .Values.config }}
  annotations:
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- if .Values.config }}
    # A changed config file rolls the pods.
    checksum/config: {{ .Values.config | sha256sum }}
    {{- end }}
  {{- end }}
spec:
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  automountServiceAccountToken: false
  # SIGTERM lets requests in flight and a consolidation run finish, each within the
  # shutdown grace, before the process ends: the kubelet waits longer than both.
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds | default (add (mul 2 .Values.shutdownGraceSeconds) 10) }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: cairn
      image: {{ include "cairn.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["serve"]
      ports:
        - name: http
          containerPort: 8080
      env:
        - name: CAIRN_LISTEN
          value: "0.0.0.0:8080"
        - name: CAIRN_DATA_DIR
          value: /data
        - name: CAIRN_MCP_ALLOWED_HOSTS
          value: {{ include "cairn.allowedHosts" . | quote }}
        - name: CAIRN_SHUTDOWN_GRACE_SECONDS
          value: {{ .Values.shutdownGraceSeconds | quote }}
        {{- if .Values.jwt.jwksUrl }}
        - name: CAIRN_JWT_JWKS_URL
          value: {{ .Values.jwt.jwksUrl | quote }}
        {{- else }}
        - name: CAIRN_JWT_SECRET_FILE
          value: /var/run/secrets/cairn/jwt/jwt-secret
        {{- end }}
        {{- with .Values.jwt.audience }}
        - name: CAIRN_JWT_AUDIENCE
          value: {{ . | quote }}
        {{- end }}
        {{- with .Values.jwt.issuer }}
        - name: CAIRN_JWT_ISSUER
          value: {{ . | quote }}
        {{- end }}
        {{- if .Values.jwt.maxTtlSeconds }}
        - name: CAIRN_JWT_MAX_TTL_SECONDS
          value: {{ .Values.jwt.maxTtlSeconds | quote }}
        {{- end }}
        {{- if eq .Values.mode "cluster" }}
        - name: CAIRN_BACKEND
          value: {{ .Values.cluster.engine | quote }}
        - name: CAIRN_CLUSTER_URL
          value: {{ required "cluster.url is required in cluster mode" .Values.cluster.url | quote }}
        - name: CAIRN_INDEX_PREFIX
          value: {{ .Values.cluster.indexPrefix | quote }}
        {{- if ne (toString .Values.cluster.indexReplicas) "" }}
        - name: CAIRN_CLUSTER_REPLICAS
          value: {{ .Values.cluster.indexReplicas | quote }}
        {{- end }}
        {{- if .Values.cluster.existingSecret }}
        {{- $variables := dict "username" "CAIRN_CLUSTER_USERNAME_FILE" "password" "CAIRN_CLUSTER_PASSWORD_FILE" "api-key" "CAIRN_CLUSTER_API_KEY_FILE" "bearer-token" "CAIRN_CLUSTER_BEARER_TOKEN_FILE" "ca.crt" "CAIRN_CLUSTER_CA_CERT" "tls.crt" "CAIRN_CLUSTER_CLIENT_CERT" "tls.key" "CAIRN_CLUSTER_CLIENT_KEY" }}
        {{- range .Values.cluster.secretKeys }}
        - name: {{ required (printf "cluster.secretKeys: unknown key %s" .) (get $variables .) }}
          value: /var/run/secrets/cairn/cluster/{{ . }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- if .Values.config }}
        - name: CAIRN_CONFIG
          value: /etc/cairn/cairn.toml
        {{- end }}
        {{- if .Values.serviceMonitor.tokenSecret.name }}
        - name: CAIRN_METRICS_TOKEN_FILE
          value: /var/run/secrets/cairn/metrics/{{ .Values.serviceMonitor.tokenSecret.key }}
        {{- end }}
        {{- with .Values.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        runAsNonRoot: true
        capabilities:
          drop: [ALL]
        seccompProfile:
          type: RuntimeDefault
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 2
        failureThreshold: 60
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 5
        failureThreshold: 3
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        failureThreshold: 6
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      volumeMounts:
        - name: data
          mountPath: /data
        - name: tmp
          mountPath: /tmp
        {{- if not .Values.jwt.jwksUrl }}
        - name: jwt
          mountPath: /var/run/secrets/cairn/jwt
          readOnly: true
        {{- end }}
        {{- if and (eq .Values.mode "cluster") .Values.cluster.existingSecret }}
        - name: cluster-credentials
          mountPath: /var/run/secrets/cairn/cluster
          readOnly: true
        {{- end }}
        {{- if .Values.config }}
        - name: config
          mountPath: /etc/cairn
          readOnly: true
        {{- end }}
        {{- if .Values.serviceMonitor.tokenSecret.name }}
        - name: metrics-token
          mountPath: /var/run/secrets/cairn/metrics
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if eq .Values.mode "cluster" }}
    # The cluster holds the memory; the data directory keeps only local state.
    - name: data
      emptyDir: {}
    {{- end }}
    {{- if not .Values.jwt.jwksUrl }}
    - name: jwt
      secret:
        secretName: {{ include "cairn.jwtSecretName" . }}
        defaultMode: 0400
    {{- end }}
    {{- if and (eq .Values.mode "cluster") .Values.cluster.existingSecret }}
    - name: cluster-credentials
      secret:
        secretName: {{ .Values.cluster.existingSecret }}
        defaultMode: 0400
    {{- end }}
    {{- if .Values.config }}
    - name: config
      configMap:
        name: {{ include "cairn.fullname" . }}-config
    {{- end }}
    {{- with .Values.serviceMonitor.tokenSecret.name }}
    - name: metrics-token
      secret:
        secretName: {{ . }}
        defaultMode: 0400
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Host values /mcp answers to: the service's names in the cluster, and the Ingress host. */}}
{{- define "cairn.allowedHosts" -}}
{{- $name := include "cairn.fullname" . -}}
{{- $hosts := list $name (printf "%s.%s" $name .Release.Namespace) (printf "%s.%s.svc" $name .Release.Namespace) (printf "%s.%s.svc.cluster.local" $name .Release.Namespace) -}}
{{- if .Values.ingress.enabled -}}
{{- $hosts = append $hosts .Values.ingress.host -}}
{{- end -}}
{{- join "," $hosts -}}
{{- end -}}
