#!/usr/bin/env bash
# Installs Temporal's time-skipping test server for the workflow tests and prints the
# path of a launcher that `WorkflowEnvironment.start_time_skipping(
# test_server_existing_path=...)` runs as `<launcher> <port> [flags]`.
#
# Why not the SDK's own download: it fetches a native build from temporal.download,
# which this project's machines and CI cannot reach. Maven Central they can: the test
# server is the Java artifact io.temporal:temporal-test-server. Its jars and their
# runtime dependencies are pinned below by version and sha256 (the closure Maven
# resolves), fetched with curl (no Maven needed) and cached in
# ~/.cache/kama/temporal-test-server/<version>. Needs a Java 8+ runtime: the `java` on
# PATH, else (when run as root, as CI is) Debian's openjdk-17-jre-headless.
set -euo pipefail
# shellcheck source=debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

VERSION="${KAMA_TEMPORAL_TEST_SERVER_VERSION:-1.38.0}"
CACHE_ROOT="${KAMA_CACHE_DIR:-$HOME/.cache/kama}"
OUT="$CACHE_ROOT/temporal-test-server/$VERSION"
LIB="$OUT/lib"
LAUNCHER="$OUT/bin/temporal-test-server"
MAVEN="${KAMA_MAVEN_REPOSITORY:-https://repo1.maven.org/maven2}"

log() { printf '[build-test-server %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# group:artifact:version sha256, one jar a line: temporal-test-server and its runtime
# dependencies. To move to another version, resolve them again, e.g. with
# `mvn dependency:list -DincludeScope=runtime` on a pom that depends on it.
declare -A JARS
JARS[1.38.0]="
  com.cronutils:cron-utils:9.2.1 02af0e8b2fe93c9fa6eecf97b53b39faae14c5b996356edb132e9fe620013744
  com.fasterxml.jackson.core:jackson-annotations:2.15.4 f204ebbd552614a22b8531ffe350d47f8fd42c45bb60517c07974dc27a5a1dd3
  com.fasterxml.jackson.core:jackson-core:2.15.4 8dc9210dd285db366f45f518dd1e6a9ccfeb0f1a8e184a899fe96d29edf1fd94
  com.fasterxml.jackson.core:jackson-databind:2.15.4 0f99ff7719eef3ee85608b3dee6ecf3c698003fe9d6e34eabbfabccdc9b5ac2c
  com.fasterxml.jackson.datatype:jackson-datatype-jdk8:2.15.4 3efb9d55b62f50e64b11fe00625800285fef8781736b80bd206677fb56040aac
  com.fasterxml.jackson.datatype:jackson-datatype-jsr310:2.15.4 472498cbba2726012ff82f86fc8feef9593663bda1a695a17db804a63fa733ff
  com.google.android:annotations:4.1.1.4 ba734e1e84c09d615af6a09d33034b4f0442f8772dec120efb376d86a565ae15
  com.google.api.grpc:proto-google-common-protos:2.59.2 9407f50aef5d1cb12675c170fa64ee216023eefca49f8f5eac45124f23a6cb29
  com.google.code.findbugs:jsr305:3.0.2 766ad2a0783f2687962c8ad74ceecc38a28b9f72a2d085ee438b7813e928d0c7
  com.google.code.gson:gson:2.10.1 4241c14a7727c34feea6507ec801318a3d4a90f070e4525681079fb94ee4c593
  com.google.errorprone:error_prone_annotations:2.36.0 77440e270b0bc9a249903c5a076c36a722c4886ca4f42675f2903a1c53ed61a5
  com.google.guava:failureaccess:1.0.3 cbfc3906b19b8f55dd7cfd6dfe0aa4532e834250d7f080bd8d211a3e246b59cb
  com.google.guava:guava:33.4.8-android a1f8a4bafe5a77232d333356843e194599b30837574a7f4be1063daaaaab102c
  com.google.guava:listenablefuture:9999.0-empty-to-avoid-conflict-with-guava b372a037d4230aa57fbeffdef30fd6123f9c0c2db85d0aced00c91b974f33f99
  com.google.j2objc:j2objc-annotations:3.0.0 88241573467ddca44ffd4d74aa04c2bbfd11bf7c17e0c342c94c9de7a70a7c64
  com.google.protobuf:protobuf-java-util:3.25.8 e7196eaefc3f81afa1571821635c7aefe2933f4be4a9df9e601fb59214b50269
  com.google.protobuf:protobuf-java:3.25.8 72bdb32eb38cafb7dcd288262c29a34d57cba2e19101af9685155ba8c0a56008
  com.uber.m3:tally-core:0.13.0 b3ccc572be36be91c47447c7778bc141a74591279cdb40224882e8ac8271b58b
  io.grpc:grpc-api:1.76.0 13ce42c59871a04a7340f01e1dbd879fefa04811878cfd68864596321f555ed3
  io.grpc:grpc-context:1.76.0 3b4eb9ca65fe5cd98b2665f9b355158fac5a048708626b5b68dc66c43fb820d3
  io.grpc:grpc-core:1.76.0 00926861e7dcd9ce993a3ed3cb6f55b104c0a3ad0dad2cdde8680d1bcbd100b6
  io.grpc:grpc-inprocess:1.76.0 cb1f0095ab7f2603508433554ec7bd9602bbe0e3340ade262c58e911cb8ccc63
  io.grpc:grpc-netty-shaded:1.76.0 196ef71498808fbd81555af0c5b00e0f6e8263d8e6d2bc115d36239088876328
  io.grpc:grpc-protobuf-lite:1.76.0 5fb276bfc4974182888e11c1c0115d9d01cb970a39fc75c8c73695d3da13d878
  io.grpc:grpc-protobuf:1.76.0 52a004da0065d39601257ded13c40e0e4dfcf74db1c55a9bf7932a88fc384809
  io.grpc:grpc-services:1.76.0 64ed014542d83664b401faed38d6b32cbd624234481c71a7277c777937c0e902
  io.grpc:grpc-stub:1.76.0 e8d2fb3f6a75c8052c16173072111cb5140c8a0ad054a0c43188e0d1da162de6
  io.grpc:grpc-util:1.76.0 f342c19c9dc3ac9235a0b5d564834b326b375831373d5a9f87b2b5362553b17e
  io.micrometer:micrometer-core:1.9.9 ddec1c877a32dcf4f5e6cab5efc22707975d1d7e0fb780bcffe505384c52070c
  io.nexusrpc:nexus-sdk:0.5.0-alpha 0619e8f4559b17bdc3610a4aeb9b961e414b3642ca15fcf1c9e3aed14b573175
  io.perfmark:perfmark-api:0.27.0 c7b478503ec524e55df19b424d46d27c8a68aeb801664fadd4f069b71f52d0f6
  io.temporal:temporal-sdk:1.38.0 4d0ed300118b9dcc1251a5ab6ced503e3ca35ac8c95a4b47500b98fc20a645d0
  io.temporal:temporal-serviceclient:1.38.0 3a2b014541a0799fb182f3ae3b01ce0a5d706a70b57ee933ed4e702d7085e1c8
  io.temporal:temporal-test-server:1.38.0 c6c813bbee46dcdc9df5a018fe6ed4caaf79b0c3c9511a3dd6275232a6d8538e
  org.codehaus.mojo:animal-sniffer-annotations:1.24 c720e6e5bcbe6b2f48ded75a47bccdb763eede79d14330102e0d352e3d89ed92
  org.hdrhistogram:HdrHistogram:2.1.12 9b47fbae444feaac4b7e04f0ea294569e4bc282bc69d8c2ce2ac3f23577281e2
  org.jspecify:jspecify:1.0.0 1fad6e6be7557781e4d33729d49ae1cdc8fdda6fe477bb0cc68ce351eafdfbab
  org.latencyutils:LatencyUtils:2.0.3 a32a9ffa06b2f4e01c5360f8f9df7bc5d9454a5d373cd8f361347fa5a57165ec
  org.slf4j:slf4j-api:1.7.36 d3ef575e3e4979678dc01bf1dcce51021493b4d11fb7f1be8ad982877c16a1c0
"

# a Java 8+ runtime runs the test server
ensure_debian_packages build-test-server java=openjdk-17-jre-headless >/dev/null || exit 1
if [[ -x "$LAUNCHER" && -f "$OUT/.complete" ]]; then
  echo "$LAUNCHER"
  exit 0
fi
[[ -n "${JARS[$VERSION]:-}" ]] || { echo "build-test-server: no pinned jars for $VERSION" >&2; exit 1; }
for tool in curl sha256sum flock; do
  command -v "$tool" >/dev/null || { echo "build-test-server: $tool is required" >&2; exit 1; }
done

mkdir -p "$LIB" "$OUT/bin"
exec 9>"$OUT/.build.lock"  # one install at a time per cache entry
flock 9
if [[ -x "$LAUNCHER" && -f "$OUT/.complete" ]]; then echo "$LAUNCHER"; exit 0; fi

log "fetching temporal-test-server $VERSION and its dependencies from Maven Central"
while read -r coordinates sha256; do
  [[ -n "$coordinates" ]] || continue
  IFS=: read -r group artifact version <<<"$coordinates"
  jar="$LIB/$artifact-$version.jar"
  if [[ -f "$jar" ]] && echo "$sha256  $jar" | sha256sum -c --quiet 2>/dev/null; then continue; fi
  curl -fsSL --retry 3 -o "$jar.part" "$MAVEN/${group//.//}/$artifact/$version/$artifact-$version.jar"
  echo "$sha256  $jar.part" | sha256sum -c --quiet
  mv "$jar.part" "$jar"
done <<<"${JARS[$VERSION]}"

# the SDK starts the launcher with the port (and any extra flags) and stops it with a
# signal, so java replaces the shell; C1 only and one GC thread: it starts faster on 2 cores
cat >"$LAUNCHER.part" <<LAUNCH
#!/bin/sh
exec java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto \\
  -cp "$LIB/*" io.temporal.testserver.TestServer "\$@"
LAUNCH
chmod 0755 "$LAUNCHER.part"
mv "$LAUNCHER.part" "$LAUNCHER"
touch "$OUT/.complete"
log "done: $LAUNCHER"
echo "$LAUNCHER"
