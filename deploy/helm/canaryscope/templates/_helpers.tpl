{{/*
Names. Objects are named after the release (`canaryscope` when the release is
named so, `<release>-canaryscope` otherwise). The label app.kubernetes.io/name is
always `canaryscope`: it is part of the selectors, which `helm upgrade` cannot
change (deploy/helm/ci/immutable-fields.yaml), and the ServiceMonitor takes the
Prometheus job name from it, which the alert CanaryscopeTargetDown selects.
*/}}
{{- define "canaryscope.fullname" -}}
{{- if contains "canaryscope" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-canaryscope" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "canaryscope.judgeName" -}}
{{- printf "%s-judge" (include "canaryscope.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "canaryscope.labels" -}}
app.kubernetes.io/name: canaryscope
app.kubernetes.io/part-of: canaryscope
{{- end -}}

{{/* Selector of the daemon's pods: never change it (see above). */}}
{{- define "canaryscope.selector" -}}
app.kubernetes.io/name: canaryscope
app.kubernetes.io/component: node-observer
{{- end -}}

{{/* Selector of the judge's pods: never change it either. */}}
{{- define "canaryscope.judgeSelector" -}}
app.kubernetes.io/name: canaryscope
app.kubernetes.io/component: judge
{{- end -}}

{{- define "canaryscope.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
A duration value in seconds, as the daemon parses it (a number and an optional
unit; values.schema.json has checked the form). Call with (list NAME VALUE).
*/}}
{{- define "canaryscope.seconds" -}}
{{- $value := index . 1 | toString | trim -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $value -}}
{{- if not $number -}}
{{- fail (printf "%s: `%s` is not a duration (try 10s, 500ms, 2m)" (index . 0) $value) -}}
{{- end -}}
{{- $unit := trimPrefix $number $value -}}
{{- $scales := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- if not (hasKey $scales $unit) -}}
{{- fail (printf "%s: `%s`: unknown unit `%s` (use ms, s, m or h)" (index . 0) $value $unit) -}}
{{- end -}}
{{- mulf (float64 $number) (get $scales $unit) -}}
{{- end -}}

{{/* A duration of at least one second, as the daemon requires. (list NAME VALUE) */}}
{{- define "canaryscope.atLeastOneSecond" -}}
{{- if lt (include "canaryscope.seconds" . | float64) 1.0 -}}
{{- fail (printf "%s: `%v` is shorter than 1s" (index . 0) (index . 1)) -}}
{{- end -}}
{{- end -}}

{{/*
Value combinations the schema does not refuse with a clear message: each `fail`
names the value at fault.
*/}}
{{- define "canaryscope.checkValues" -}}
{{- if and .Values.hold (not (has "gpu" .Values.probes)) -}}
{{- fail "hold: true needs the gpu probes: add gpu to probes" -}}
{{- end -}}
{{- if and .Values.gateTimeout (not .Values.readinessGate) -}}
{{- fail "gateTimeout is set but readinessGate is false: the timeout is the gate's" -}}
{{- end -}}
{{- if .Values.gateTimeout -}}
{{- include "canaryscope.atLeastOneSecond" (list "gateTimeout" .Values.gateTimeout) -}}
{{- end -}}
{{- include "canaryscope.atLeastOneSecond" (list "hotWindow" .Values.hotWindow) -}}
{{- $initTimeout := include "canaryscope.seconds" (list "gpuInitTimeout" .Values.gpuInitTimeout) | float64 -}}
{{- if and (gt $initTimeout 0.0) (lt $initTimeout 1.0) -}}
{{- fail (printf "gpuInitTimeout: `%s` is shorter than 1s (0 turns the check off)" .Values.gpuInitTimeout) -}}
{{- end -}}
{{- if eq (include "canaryscope.seconds" (list "stallThreshold" .Values.stallThreshold) | float64) 0.0 -}}
{{- fail (printf "stallThreshold: `%s` would count every GPU call as stalled" .Values.stallThreshold) -}}
{{- end -}}
{{- $_ := include "canaryscope.seconds" (list "seriesGrace" .Values.seriesGrace) -}}
{{- range $i, $t := .Values.tolerations -}}
{{- if and (eq ($t.operator | default "Equal") "Exists") $t.value -}}
{{- fail (printf "tolerations[%d]: operator Exists takes no value (it matches every value of key %q)" $i ($t.key | default "")) -}}
{{- end -}}
{{- if and (not $t.key) (ne ($t.operator | default "Equal") "Exists") -}}
{{- fail (printf "tolerations[%d]: a toleration without a key must have operator Exists" $i) -}}
{{- end -}}
{{- if and (hasKey $t "tolerationSeconds") (ne ($t.effect | default "") "NoExecute") -}}
{{- fail (printf "tolerations[%d]: tolerationSeconds is only for effect NoExecute" $i) -}}
{{- end -}}
{{- end -}}
{{- range $i, $c := .Values.cgroups -}}
{{- if hasPrefix "/sys/fs/cgroup" $c -}}
{{- fail (printf "cgroups[%d]: `%s`: name the cgroup as /proc/PID/cgroup shows it, without the cgroupfs mount" $i $c) -}}
{{- end -}}
{{- if regexMatch "(^|/)\\.\\.?(/|$)" $c -}}
{{- fail (printf "cgroups[%d]: `%s`: no . or .. components" $i $c) -}}
{{- end -}}
{{- end -}}
{{- range $i, $a := .Values.extraArgs -}}
{{- if or (hasPrefix "--listen" $a) (eq $a "run") -}}
{{- fail (printf "extraArgs[%d]: %s is set by the chart (the Service, probes and ServiceMonitor use port 9464)" $i $a) -}}
{{- end -}}
{{- end -}}
{{- end -}}
