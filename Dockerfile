# Multi-stage build of the sequenced operator image.
#   docker build -t sequenced:dev .
# Stage 1 builds the release binary; stages 2 and 3 fetch a pinned helm and a pinned kubectl (whose
# built-in kustomize runs spec.postRenderers) and check their sha256; stage 4 ships the three on
# a small non-root base (distroless cc: glibc, CA certificates, user 65532).

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Cargo reads every target that Cargo.toml declares (the [[bench]] too) and every workspace member
# (the test support crate in tests/support) before it builds one.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests/support ./tests/support
RUN cargo build --release --locked --bin sequenced

FROM debian:bookworm-slim AS helm
ARG HELM_VERSION=v4.1.4
# Set by BuildKit from --platform; amd64 for the classic builder.
ARG TARGETARCH=amd64
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLO "https://get.helm.sh/helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz" \
 && curl -fsSLO "https://get.helm.sh/helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz.sha256sum" \
 && sha256sum -c "helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz.sha256sum" \
 && tar -xzf "helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz" \
 && install -m 0755 "linux-${TARGETARCH}/helm" /usr/local/bin/helm

# kubectl, for its built-in kustomize: spec.postRenderers run through it.
FROM debian:bookworm-slim AS kubectl
ARG KUBECTL_VERSION=v1.35.2
ARG TARGETARCH=amd64
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLO "https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/${TARGETARCH}/kubectl" \
 && curl -fsSLO "https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/${TARGETARCH}/kubectl.sha256" \
 && echo "$(cat kubectl.sha256)  kubectl" | sha256sum -c - \
 && install -m 0755 kubectl /usr/local/bin/kubectl

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=helm /usr/local/bin/helm /usr/local/bin/helm
COPY --from=kubectl /usr/local/bin/kubectl /usr/local/bin/kubectl
COPY --from=build /src/target/release/sequenced /usr/local/bin/sequenced
# The root file system is read-only in the chart: everything written goes under /tmp, where the
# chart mounts an emptyDir.
ENV SEQUENCED_HELM=/usr/local/bin/helm \
    SEQUENCED_KUBECTL=/usr/local/bin/kubectl \
    SEQUENCED_CACHE_DIR=/tmp/sequenced/charts \
    HELM_CACHE_HOME=/tmp/helm/cache \
    HELM_CONFIG_HOME=/tmp/helm/config \
    HELM_DATA_HOME=/tmp/helm/data
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sequenced"]
CMD ["run"]
