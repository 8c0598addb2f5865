// The browser peer's shell: storage (OPFS, IndexedDB where OPFS is
// missing) and the identity key (IndexedDB) for the WebAssembly peer, and
// the page's view. The protocol, verification and store are Go
// (swarm/browser/app); this file only moves bytes and draws.
//
// URL parameters: signal (ws://host:port/v1), topic, loopback (1: keep to
// 127.0.0.1 candidates), store (a name: pages with different names keep
// different blobs and identities in one browser), budget (bytes), cid (fetch
// it at once), links (connections a fetch opens to each peer), storage
// (indexeddb: do without OPFS, as browsers without it do). Defaults come
// from config.json, which the daemon serves.
"use strict";

const params = new URLSearchParams(location.search);
const storeName = (params.get("store") || "default").replace(/[^A-Za-z0-9_-]/g, "_");

function idbOpen() {
  return new Promise((resolve, reject) => {
    const rq = indexedDB.open("rdrr-" + storeName, 1);
    rq.onupgradeneeded = () => {
      rq.result.createObjectStore("kv");
      rq.result.createObjectStore("files");
    };
    rq.onsuccess = () => resolve(rq.result);
    rq.onerror = () => reject(rq.error);
  });
}

function idbDo(db, store, mode, f) {
  return new Promise((resolve, reject) => {
    const tx = db.transaction(store, mode);
    const rq = f(tx.objectStore(store));
    tx.oncomplete = () => resolve(rq ? rq.result : undefined);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

function idbKV(db) {
  return {
    get: (k) => idbDo(db, "kv", "readonly", (s) => s.get(k)).then((v) => v === undefined ? null : v),
    put: (k, v) => idbDo(db, "kv", "readwrite", (s) => s.put(v, k)),
  };
}

// Whole files by name in IndexedDB, for browsers without OPFS.
function idbFiles(db) {
  return {
    kind: "indexeddb",
    write: (name, data) => idbDo(db, "files", "readwrite", (s) => s.put(data, name)),
    read: (name, off, n) => idbDo(db, "files", "readonly", (s) => s.get(name))
      .then((v) => v === undefined ? null : v.subarray(Math.min(off, v.length), Math.min(off + n, v.length))),
    remove: (name) => idbDo(db, "files", "readwrite", (s) => s.delete(name)),
    list: () => idbDo(db, "files", "readonly", (s) => s.getAllKeys()),
  };
}

// Whole files by name in the origin private file system.
async function opfsFiles() {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle("rdrr-" + storeName, { create: true });
  const missing = (e) => e && (e.name === "NotFoundError" || e.name === "TypeMismatchError");
  return {
    kind: "opfs",
    async write(name, data) {
      const fh = await dir.getFileHandle(name, { create: true });
      const w = await fh.createWritable(); // a swap file, replacing the file at close
      await w.write(data);
      await w.close();
    },
    async read(name, off, n) {
      let fh;
      try { fh = await dir.getFileHandle(name); } catch (e) { if (missing(e)) return null; throw e; }
      const f = await fh.getFile();
      return new Uint8Array(await f.slice(off, off + n).arrayBuffer());
    },
    async remove(name) {
      try { await dir.removeEntry(name); } catch (e) { if (!missing(e)) throw e; }
    },
    async list() {
      const out = [];
      for await (const k of dir.keys()) out.push(k);
      return out;
    },
  };
}

async function shellStorage() {
  const db = await idbOpen();
  let files;
  try {
    if (params.get("storage") !== "indexeddb" && navigator.storage && navigator.storage.getDirectory) files = await opfsFiles();
  } catch (e) {
    console.warn("OPFS unavailable, using IndexedDB:", e);
  }
  return { kv: idbKV(db), files: files || idbFiles(db) };
}

const $ = (id) => document.getElementById(id);
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function short(id) { return id.length > 20 ? id.slice(0, 10) + "…" + id.slice(-6) : id; }
function setRows(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.appendChild(td);
    }
    return tr;
  }));
}

// rdrrApp is what tests drive: started resolves with the peer's ID.
const rdrrApp = { lastFetch: null };
window.rdrrApp = rdrrApp;

async function fetchCID(cid) {
  const t0 = performance.now();
  $("progress").value = 0;
  $("fetch-result").textContent = "fetching " + cid;
  rdrrApp.lastFetch = { cid, state: "running" };
  let first = null; // the first verified piece: steady rate from there on
  let last = null;
  try {
    const r = await rdrrPeer.fetch(cid, (done, total) => {
      const now = performance.now();
      if (!first && done > 0) first = { t: now, done };
      last = { t: now, done };
      $("progress").max = total || 1;
      $("progress").value = done;
      const s = (performance.now() - t0) / 1000;
      $("rate").textContent = bytes(done) + " of " + bytes(total) + " · " + (done / 1e6 / s).toFixed(2) + " MB/s";
    });
    const hash = await rdrrPeer.hash(cid);
    const s = r.ms / 1000;
    $("progress").max = 1;
    $("progress").value = 1;
    $("rate").textContent = bytes(r.size) + " in " + s.toFixed(2) + " s · " + (r.fetched / 1e6 / Math.max(s, 1e-3)).toFixed(2) + " MB/s";
    $("fetch-result").textContent = "done: BLAKE3 of what is kept " + hash;
    $("fetch-result").className = "mono ok";
    // The rate after the first verified piece, leaving out connecting
    // and asking who has the blob: what a raw channel is compared with.
    const steady = first && last && last.t > first.t ? (last.done - first.done) / 1e3 / (last.t - first.t) : 0;
    rdrrApp.lastFetch = Object.assign({ state: "done", hash, steady_mbps: steady }, r);
    return rdrrApp.lastFetch;
  } catch (e) {
    $("fetch-result").textContent = "failed: " + e.message;
    $("fetch-result").className = "mono bad";
    rdrrApp.lastFetch = { cid, state: "failed", error: e.message };
    throw e;
  }
}
rdrrApp.fetch = fetchCID;

async function refresh() {
  try {
    const s = await rdrrPeer.stats();
    rdrrApp.stats = s;
    $("online").textContent = s.online ? "online" : "reconnecting";
    $("online").className = s.online ? "ok" : "bad";
    setRows($("peers"), (s.peers || []).map((p) => [short(p.id), p.links, bytes(p.in), bytes(p.out)]));
    setRows($("blobs"), (s.blobs || []).map((b) => [b.cid, bytes(b.size), b.whole ? "whole" : bytes(b.verified)]));
    $("used").textContent = bytes(s.used) + " of " + bytes(s.budget);
    $("served").textContent = bytes(s.served || 0);
    $("fetched").textContent = bytes(s.fetched || 0);
    $("bad").textContent = s.bad_slices || 0;
    $("banned").textContent = (s.banned || []).length;
  } catch (e) {
    // not started yet
  }
}

// A built-in kernel check: y = a*x + b over 1M floats on the GPU, compared
// with the CPU.
async function gpuCheck() {
  if (!navigator.gpu) return "no WebGPU in this browser";
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return "WebGPU: no adapter";
  const dev = await adapter.requestDevice();
  const n = 1 << 20;
  const x = new Float32Array(n);
  for (let i = 0; i < n; i++) x[i] = (i % 1000) / 7;
  const code = `@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) id: vec3u) {
  if (id.x < arrayLength(&v)) { v[id.x] = v[id.x] * 3.0 + 1.0; }
}`;
  const buf = dev.createBuffer({ size: 4 * n, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  dev.queue.writeBuffer(buf, 0, x);
  const pipe = dev.createComputePipeline({ layout: "auto", compute: { module: dev.createShaderModule({ code }), entryPoint: "main" } });
  const bind = dev.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: buf } }] });
  const rd = dev.createBuffer({ size: 4 * n, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = dev.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipe);
  pass.setBindGroup(0, bind);
  pass.dispatchWorkgroups(n / 256);
  pass.end();
  enc.copyBufferToBuffer(buf, 0, rd, 0, 4 * n);
  const t0 = performance.now();
  dev.queue.submit([enc.finish()]);
  await rd.mapAsync(GPUMapMode.READ);
  const ms = performance.now() - t0;
  const y = new Float32Array(rd.getMappedRange());
  let bad = 0;
  for (let i = 0; i < n; i++) if (Math.abs(y[i] - (Math.fround(x[i] * 3) + 1)) > 1e-3) bad++;
  const info = adapter.info || {};
  return (bad ? "FAILED: " + bad + " wrong of " + n : "ok: " + n + " elements match the CPU") +
    " · " + ms.toFixed(1) + " ms · " + (info.vendor || "") + " " + (info.architecture || info.description || "");
}

async function main() {
  let cfg = {};
  try {
    const r = await fetch("config.json");
    if (r.ok) cfg = await r.json();
  } catch (e) { /* served without a daemon */ }
  const opts = {
    signal: params.get("signal") || cfg.signal || "",
    topics: params.get("topic") ? [params.get("topic")] : (cfg.topics || ["rdrr"]),
    loopback: params.has("loopback") ? params.get("loopback") === "1" : !!cfg.loopback,
    budget: Number(params.get("budget") || cfg.budget || 0),
    links: Number(params.get("links") || cfg.links || 0),
  };
  // One tab per store: two peers over one storage would overwrite each
  // other's records, and share one identity, which signaling refuses.
  // The lock is held until the tab closes.
  if (navigator.locks) {
    const held = await new Promise((resolve) => {
      navigator.locks.request("rdrr-store-" + storeName, { ifAvailable: true }, (lock) => {
        resolve(!!lock);
        return lock ? new Promise(() => {}) : undefined;
      });
    });
    if (!held) throw new Error("store " + storeName + " is open in another tab (add ?store=NAME for another)");
  }
  const storage = await shellStorage();
  await new Promise((ready, fail) => {
    window.rdrrShell = { kv: storage.kv, files: storage.files, ready };
    const go = new Go();
    WebAssembly.instantiateStreaming(fetch("peer.wasm"), go.importObject)
      .then((r) => go.run(r.instance))
      .catch(fail);
  });
  $("storage").textContent = storage.files.kind;
  $("status").textContent = "signing in to " + opts.signal;
  const st = await rdrrPeer.start(opts);
  $("peer-id").textContent = st.id;
  $("status").textContent = "in the swarm (" + opts.topics.join(", ") + ")";
  setInterval(refresh, 500);
  refresh();
  return st;
}

rdrrApp.started = main().catch((e) => {
  $("status").textContent = "failed: " + e.message;
  $("status").className = "bad";
  throw e;
});
rdrrApp.started.then(() => {
  if (params.get("cid")) fetchCID(params.get("cid")).catch(() => {});
});

$("fetch-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const cid = $("cid").value.trim();
  if (cid) fetchCID(cid).catch(() => {});
});
$("file").addEventListener("change", async () => {
  const f = $("file").files[0];
  if (!f) return;
  const cid = await rdrrPeer.put(new Uint8Array(await f.arrayBuffer()));
  $("added").textContent = cid;
});
$("gpu-button").addEventListener("click", async () => {
  $("gpu").textContent = "running…";
  try { $("gpu").textContent = await gpuCheck(); } catch (e) { $("gpu").textContent = "failed: " + e.message; }
});
rdrrApp.gpuCheck = gpuCheck;
rdrrApp.refresh = refresh;
