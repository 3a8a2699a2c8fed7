{{/* A Deployment running the example image; call with (dict "root" $ "name" "x" "annotations" (dict ...)). */}}
{{- define "shop.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  labels:
    app.kubernetes.io/name: {{ .name }}
    app.kubernetes.io/instance: {{ .root.Release.Name }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  replicas: {{ .root.Values.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ .name }}
      app.kubernetes.io/instance: {{ .root.Release.Name }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ .name }}
        app.kubernetes.io/instance: {{ .root.Release.Name }}
    spec:
      containers:
        - name: main
          image: {{ .root.Values.image }}
{{- end -}}
