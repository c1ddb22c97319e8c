# Trellis server image: one image runs the whole ensemble or any single stage,
# chosen by its arguments (see deploy/README.md).
#
#   docker build -t trellis-server .                       # from the official Node image
#   docker build --build-arg BASE_IMAGE=my/node20 -t trellis-server .
#   docker run --rm -p 8000-8002:8000-8002 trellis-server    # the bundled MobileNetV2 in the seed's ensemble
#   docker run --rm -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" trellis-server
#
# The model repository is /models: by default the image's own (the seed's configs with the bundled
# MobileNetV2, tooling/bundled, and its ImageNet labels), or one mounted over it (or another path
# given with --model-repository). BASE_IMAGE must be a Debian/Ubuntu (glibc) image with
# Node.js 20.19+ as `node` (and npm or pnpm).
ARG BASE_IMAGE=node:20-bookworm-slim

FROM ${BASE_IMAGE} AS build
# Extra pnpm flags for fetch and install, and pnpm's minimumReleaseAge (minutes; 1440 is its
# default). deploy:test, whose lockfile the host's pnpm already verified, builds with the host's
# store mounted, PNPM_FLAGS=--offline and PNPM_MINIMUM_RELEASE_AGE=0: no registry needed.
ARG PNPM_FLAGS=""
ARG PNPM_MINIMUM_RELEASE_AGE=1440
ENV ONNXRUNTIME_NODE_INSTALL=skip CI=true TURBO_TELEMETRY_DISABLED=1 TURBO_NO_UPDATE_NOTIFIER=1 \
    pnpm_config_minimum_release_age=${PNPM_MINIMUM_RELEASE_AGE}
WORKDIR /src
RUN command -v pnpm >/dev/null || npm install -g pnpm@12.4.2
# Packages from the lockfile alone first: this layer is reused while pnpm-lock.yaml is unchanged.
# (A store bind-mounted at /pnpm/store at build time, `podman build -v <store>:/pnpm/store`, saves the downloads.)
COPY pnpm-lock.yaml pnpm-workspace.yaml package.json ./
RUN pnpm fetch --store-dir /pnpm/store ${PNPM_FLAGS}
COPY . .
RUN pnpm install --frozen-lockfile --store-dir /pnpm/store ${PNPM_FLAGS}
# The server's workspace dependencies (the page, @trellis/web, among them), then the server itself
# (not its benches) with the page copied into its dist/ui.
RUN pnpm turbo build --filter='@trellis/server^...' --output-logs=errors-only \
 && pnpm --filter @trellis/server exec tsc -p tsconfig.build.json \
 && pnpm --filter @trellis/server exec node scripts/copy-ui.mjs
# Production node_modules with the stage packages the model loader imports by name
# (@trellis/preprocess, @trellis/postprocess, @trellis/inference-onnx, ...) copied in.
RUN pnpm --filter @trellis/server deploy --prod --store-dir /pnpm/store ${PNPM_FLAGS} /out \
 && rm -f /out/pnpm-lock.yaml /out/pnpm-workspace.yaml \
 && arch=$(node -p 'process.arch') \
 && for bin in /out/node_modules/.pnpm/onnxruntime-node@*/node_modules/onnxruntime-node/bin/napi-v*; do \
      find "$bin" -mindepth 2 -maxdepth 2 -type d ! -path "$bin/linux/$arch" -exec rm -rf {} +; \
    done
# The default repository: the seed's ensemble with the bundled MobileNetV2 in its inference step
# (what `pnpm start` serves offline); the model's licence and source beside the app.
RUN for dir in models/resnet50_*/; do \
      name=$(basename "$dir") && mkdir -p "/models/$name/1" && cp "$dir/config.pbtxt" "/models/$name/"; \
    done \
 && cp tooling/bundled/mobilenetv2-12-int8.onnx /models/resnet50_inference/1/model.onnx \
 && cp tooling/bundled/imagenet-1k-labels.txt /models/resnet50_postprocess/1/imagenet_classes.txt \
 && mkdir -p /out/bundled && cp tooling/bundled/README.md tooling/bundled/LICENSE /out/bundled/

FROM ${BASE_IMAGE} AS runtime
ENV NODE_ENV=production HOME=/tmp
WORKDIR /app
COPY --from=build /out /app
COPY --from=build /models /models
# Not root. Node is PID 1: the server handles SIGTERM/SIGINT itself, draining
# in-flight requests for up to --exit-timeout-secs (30 s by default) before it exits.
USER 65532:65532
EXPOSE 8000 8001 8002
ENTRYPOINT ["node", "/app/dist/main.js"]
CMD ["--model-repository=/models", "--host=0.0.0.0"]
