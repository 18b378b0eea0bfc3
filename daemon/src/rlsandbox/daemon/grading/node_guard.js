// The grader's guard for node's built-in test runner (`node --test`), the counterpart of
// pytest_guard.py for Node (docs/GRADING.md, "Results the code under test cannot rewrite").
// Copied into a clean room under a random name and loaded into every node process of the test
// command with `--require` (NODE_OPTIONS), before any code under test. Node >= 18, no packages.
// Never run by the daemon (it reads this file as bytes).
//
// Roles, by the process it finds itself in:
// - the runner ("parent": `node --test`, which runs no code under test; each test file runs in a
//   child process of its own): reads its configuration (an HMAC key) from a file it deletes at
//   once; gives each test file's process a key of its own through an extra socket (fd 3) the
//   runner never sees, never through a file or the environment; checks the signature and order of
//   every record that child sends back, and writes its own signed record of each to its stderr
//   (fd 2: a pipe to the sandbox agent, which no child of it can write to);
// - a test file's process ("child"): takes its key from fd 3 before any test file is loaded;
//   witnesses every test body itself: a test counts as passed only where its own function (or its
//   promise, or its done callback) ended without an error, registered from a test file the agent
//   did not write, with the assertion library and the language's built-ins as they were before any
//   code under test ran; each witness is signed and sent to the runner;
// - mocha's and jest's own process: runner and witness at once (jest also keys its workers);
// - any other node process (npm, a tool the tests start): holds no key, left alone.
//
// What the code under test can no longer do (each refused and recorded as tampering): reach the
// key through node's internal bindings, native add-ons, heap snapshots, the inspector (also the
// SIGUSR1 that would start it), or by reading the process's memory through /proc; another process
// of the run cannot read it either: every process of the run makes itself undumpable (the kernel
// then refuses /proc/<pid>/mem, /proc/<pid>/fd and ptrace to processes without CAP_SYS_PTRACE).
// Forged TAP or v8-serialized results on the runner's stdout pass nothing: the grader counts a
// pass only where a signed witness says so (guard.py, read_node_guard_log).
'use strict';

(function rlsandboxNodeGuard() {
  const CFG_ENV = 'RLSANDBOX_NODE_GUARD_CFG';
  const CHILD_ENV = 'RLSANDBOX_NODE_GUARD_CHILD';
  const GUARD_FILE = __filename;

  // What the guard itself calls, taken before any code under test runs (it may replace any
  // prototype's methods afterwards).
  const ReflectApply = Reflect.apply;
  const ObjectCreate = Object.create;
  const ObjectDefineProperty = Object.defineProperty;
  const ObjectGetOwnPropertyNames = Object.getOwnPropertyNames;
  const ObjectGetOwnPropertyDescriptor = Object.getOwnPropertyDescriptor;
  const ObjectGetPrototypeOf = Object.getPrototypeOf;
  const ObjectFreeze = Object.freeze;
  const stringify = JSON.stringify;
  const SymbolFor = Symbol.for;
  const parseJSON = JSON.parse;
  const Uint8ArrayC = Uint8Array;
  const Int32ArrayC = Int32Array;
  const ErrorC = Error;
  const captureStackTrace = Error.captureStackTrace;
  const uncurry = (fn) => (self, ...args) => ReflectApply(fn, self, args);
  const charCodeAt = uncurry(String.prototype.charCodeAt);
  const startsWith = uncurry(String.prototype.startsWith);
  const endsWith = uncurry(String.prototype.endsWith);
  const indexOf = uncurry(String.prototype.indexOf);
  const sliceStr = uncurry(String.prototype.slice);
  const toHex = (n) => (n >>> 0).toString(16);  // a number's method: primitives' prototypes are checked too

  const BufferFrom = Buffer.from;
  const BufferConcat = Buffer.concat;
  const socketWrite = uncurry(require('net').Socket.prototype.write);
  const fs = require('fs');
  const pathMod = require('path');
  const Module = require('module');
  const workerThreads = require('worker_threads');
  const isMainThread = workerThreads.isMainThread;
  const readSync = fs.readSync;
  const writeSync = fs.writeSync;
  const closeSync = fs.closeSync;
  const statSync = fs.statSync;
  const readlinkSync = fs.readlinkSync;
  const readFileSync = fs.readFileSync;
  const unlinkSync = fs.unlinkSync;
  const resolvePath = pathMod.resolve;
  const fileURLToPath = require('url').fileURLToPath;
  const isAbsolute = pathMod.isAbsolute;

  // -- HMAC-SHA256 in plain arithmetic: no method of any object the code under test can reach ----
  const K = new Int32ArrayC([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  ]);
  const H0 = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
  const W = new Int32ArrayC(64);

  function compress(h, bytes, off) {
    for (let i = 0; i < 16; i++) {
      const j = off + i * 4;
      W[i] = (bytes[j] << 24) | (bytes[j + 1] << 16) | (bytes[j + 2] << 8) | bytes[j + 3];
    }
    for (let i = 16; i < 64; i++) {
      const a = W[i - 15], b = W[i - 2];
      const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
      const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
      W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
    }
    let a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (k + S1 + ((e & f) ^ (~e & g)) + K[i] + W[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h[0] = (h[0] + a) | 0; h[1] = (h[1] + b) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
    h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + k) | 0;
  }

  // SHA-256 of (64 bytes already folded into ``start``) + ``bytes``; the digest as 32 bytes.
  function sha256From(start, bytes, n) {
    const h = new Int32ArrayC(8);
    for (let i = 0; i < 8; i++) h[i] = start[i];
    const total = n + 64;
    const padded = new Uint8ArrayC(((n + 9 + 63) >> 6) << 6);
    for (let i = 0; i < n; i++) padded[i] = bytes[i];
    padded[n] = 0x80;
    const bits = total * 8;
    const end = padded.length;
    padded[end - 4] = (bits >>> 24) & 255; padded[end - 3] = (bits >>> 16) & 255;
    padded[end - 2] = (bits >>> 8) & 255; padded[end - 1] = bits & 255;
    padded[end - 5] = (bits / 0x100000000) & 255;
    for (let off = 0; off < end; off += 64) compress(h, padded, off);
    const out = new Uint8ArrayC(32);
    for (let i = 0; i < 8; i++) {
      out[i * 4] = (h[i] >>> 24) & 255; out[i * 4 + 1] = (h[i] >>> 16) & 255;
      out[i * 4 + 2] = (h[i] >>> 8) & 255; out[i * 4 + 3] = h[i] & 255;
    }
    return out;
  }

  function utf8(s) {
    const out = new Uint8ArrayC(s.length * 3);
    let n = 0;
    for (let i = 0; i < s.length; i++) {
      let c = charCodeAt(s, i);
      if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) {
        const d = charCodeAt(s, i + 1);
        if (d >= 0xdc00 && d < 0xe000) {
          c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
          i++;
        }
      }
      if (c >= 0xd800 && c < 0xe000) c = 0xfffd; // a lone surrogate, as TextEncoder writes it
      if (c < 0x80) out[n++] = c;
      else if (c < 0x800) { out[n++] = 0xc0 | (c >> 6); out[n++] = 0x80 | (c & 63); }
      else if (c < 0x10000) { out[n++] = 0xe0 | (c >> 12); out[n++] = 0x80 | ((c >> 6) & 63); out[n++] = 0x80 | (c & 63); }
      else {
        out[n++] = 0xf0 | (c >> 18); out[n++] = 0x80 | ((c >> 12) & 63);
        out[n++] = 0x80 | ((c >> 6) & 63); out[n++] = 0x80 | (c & 63);
      }
    }
    return [out, n];
  }

  // A signer for ``key`` (bytes): the key's padded states only, the key itself wiped.
  function signer(key) {
    const pads = [new Int32ArrayC(8), new Int32ArrayC(8)];
    for (let p = 0; p < 2; p++) {
      const block = new Uint8ArrayC(64);
      for (let i = 0; i < 64; i++) block[i] = (i < key.length ? key[i] : 0) ^ (p === 0 ? 0x36 : 0x5c);
      for (let i = 0; i < 8; i++) pads[p][i] = H0[i];
      compress(pads[p], block, 0);
    }
    for (let i = 0; i < key.length; i++) key[i] = 0;
    return function sign(text) {
      const enc = utf8(text);
      const inner = sha256From(pads[0], enc[0], enc[1]);
      const mac = sha256From(pads[1], inner, 32);
      let hex = '';
      for (let i = 0; i < 32; i++) hex += (mac[i] < 16 ? '0' : '') + toHex(mac[i]);
      return hex;
    };
  }

  function randomKey() {
    const key = new Uint8ArrayC(32);
    require('crypto').randomFillSync(key); // in the runner only, before any child exists
    return key;
  }

  // -- The process ----------------------------------------------------------------------------
  const env = process.env;
  const cfgPath = env[CFG_ENV];
  const childFd = Number(env[CHILD_ENV]); // the socket the runner gave this process, when it did
  const isChild = isMainThread && childFd >= 3;
  const isRunner = isMainThread && !isChild && !!cfgPath && !env.NODE_TEST_CONTEXT &&
    process.execArgv.indexOf('--test') !== -1;
  delete env[CFG_ENV];
  delete env[CHILD_ENV];

  // Undumpable: a process that changes its effective ids becomes so for good (fs.suid_dumpable 0
  // or 2). Root sets and restores its effective group; another user cannot, and is exposed unless
  // the node it runs is not readable to it (the kernel makes such a process undumpable at exec).
  let exposed = '';
  try {
    if (process.geteuid && process.geteuid() === 0) {
      const gid = process.getegid();
      process.setegid(gid === 0 ? 1 : 0);
      process.setegid(gid);
    } else if (statSync('/proc/self/mem').uid !== 0) {
      exposed = 'the test processes run as a user that can read each other\'s memory (node is readable to it)';
    }
  } catch (e) {
    exposed = 'could not make the test process undumpable: ' + String(e && e.message);
  }

  let channel = -1; // the descriptor records are written to
  let sign = null;
  let seq = 0;

  function emit(kind, ...fields) {
    if (sign === null || channel < 0) return;
    let body = '(' + seq + ", '" + kind + "'";
    for (let i = 0; i < fields.length; i++) body += ', ' + (typeof fields[i] === 'number' ? fields[i] : stringify(String(fields[i])));
    body += ')';
    seq++;
    // A line of its own (the runner's output may be in the middle of one: jest's progress); the
    // grader takes the leading newline out with the record.
    const line = '\n' + body + '\t' + sign(body) + '\n';
    try {
      writeSync(channel, line);
    } catch (e) {
      // Nowhere to write: the records missing say so.
    }
  }

  // A worker thread has no key: what it refuses reaches its process's main thread over a channel
  // of the guard's, and is recorded there (a message forged onto it only accuses the forger).
  const GUARD_CHANNEL = 'rlsandbox-node-guard';
  function tamper(message) {
    if (!isMainThread) {
      try {
        const bc = new workerThreads.BroadcastChannel(GUARD_CHANNEL);
        bc.postMessage(String(message));
        bc.close();
      } catch (e) {
        // no channel: the refusal itself still stands
      }
      return;
    }
    emit('tamper', message);
  }

  // A mocha run (the `mocha` command, which runs every test file in its own process): the guard
  // is its runner and its witness at once, as pytest's is.
  let mochaRoot = null;
  let jestMain = false;
  if (isMainThread && !isChild && !isRunner && !!cfgPath && typeof process.argv[1] === 'string') {
    let main = '';
    try {
      main = fs.realpathSync(process.argv[1]);
    } catch (e) {
      main = '';
    }
    const m = /^(.*\/mocha\/)(?:bin\/_?mocha(?:\.js)?|lib\/cli\/cli\.js)$/.exec(main);
    if (m) mochaRoot = m[1];
    // jest: its command runs test files itself (in band) or in worker processes it starts
    jestMain = /\/jest(?:-cli)?\/bin\/jest(?:\.js)?$/.test(main);
  }
  // Processes that hold no key (npm, a tool the tests start) need no guard: their memory is worth
  // nothing, and another process's is closed to them (undumpable). Worker threads share a key
  // holder's memory: they are locked down like it.
  if (isMainThread && !isRunner && !isChild && mochaRoot === null && !jestMain) {
    // A node process that runs a script of the workspace (or code given on its command line)
    // while the key file still waits for the runner: that code could read the key. It is taken
    // away (the runner then finds none, and nothing of the run passes: fail closed).
    if (cfgPath) {
      let workspace = null;
      try {
        workspace = String(parseJSON(readFileSync(cfgPath, 'utf8')).workspace);
      } catch (e) {
        workspace = null; // no key file (the runner took it), or not ours
      }
      const main = typeof process.argv[1] === 'string' ? resolvePath(process.argv[1]) : '';
      const evals = process.execArgv.some((a) => a === '-e' || a === '-p' || startsWith(a, '--eval') || startsWith(a, '--print'));
      const ours = workspace !== null && startsWith(main, workspace + '/') && indexOf(main, '/node_modules/') === -1;
      if (workspace !== null && (ours || evals || main === '')) {
        try {
          unlinkSync(cfgPath);
        } catch (e) {
          // gone already
        }
      }
    }
    return;
  }

  // -- Lock-down: what reaches the key, in this process or another -----------------------------
  function refuse(what) {
    return function refused() {
      tamper(what + ' was used by the code under test');
      throw new ErrorC('rlsandbox grading: ' + what + ' is not available in tests');
    };
  }

  let fsBinding = null;
  try {
    fsBinding = process.binding('fs');
  } catch (e) {
    fsBinding = null;
  }
  const procMem = /^\/proc\/(?:self|thread-self|\d+)(?:\/task\/\d+)?\/(?:mem|map_files\/.*)$/;
  function checkOpened(fd) {
    if (typeof fd !== 'number' || fd < 0) return;
    let target = '';
    try {
      target = readlinkSync('/proc/self/fd/' + fd);
    } catch (e) {
      return; // undumpable and not root: /proc/self is root's, and its mem was not opened either
    }
    if (procMem.test(target)) {
      try { closeSync(fd); } catch (e) { /* gone */ }
      tamper('the code under test opened process memory (' + target + ')');
      throw new ErrorC('rlsandbox grading: process memory is not readable in tests');
    }
  }
  if (fsBinding !== null) {
    for (const name of ['open', 'openFileHandle']) {
      const orig = fsBinding[name];
      if (typeof orig !== 'function') continue;
      fsBinding[name] = function guardedOpen(...args) {
        if (typeof args[0] === 'string' && procMem.test(resolvePath(args[0]))) {
          // Asked by name (the kernel may refuse it anyway, an undumpable process's /proc is root's)
          tamper('the code under test opened process memory (' + args[0] + ')');
          throw new ErrorC('rlsandbox grading: process memory is not readable in tests');
        }
        const r = ReflectApply(orig, this, args);
        if (typeof r === 'number') checkOpened(r);
        else if (r && typeof r.fd === 'number') checkOpened(r.fd);
        return r;
      };
    }
  }
  // Node's bindings through process.binding are the ones lib/ uses (fs is the object wrapped above;
  // chai's loupe reads util's): the inspector's is the one that reaches this process's heap.
  const origBinding = process.binding;
  const refuseInspector = refuse("process.binding('inspector')");
  process.binding = function binding(name) {
    if (String(name) === 'inspector') return refuseInspector();
    return ReflectApply(origBinding, this, [name]);
  };
  for (const name of ['_debugProcess', '_debugEnd']) {
    if (typeof process[name] === 'function') process[name] = refuse('process.' + name);
  }
  // Native add-ons run code no JavaScript guard sees: only those that were there before the run
  // and are not the agent's (its changed files are known once the configuration is read).
  const origDlopen = process.dlopen;
  const startedAt = Date.now();
  let agentFile = (file) => true; // until the configuration says which files are the agent's
  process.dlopen = function dlopen(module, filename, ...rest) {
    let ok = false;
    try {
      const real = fs.realpathSync(String(filename));
      ok = statSync(real).mtimeMs < startedAt && !agentFile(real);
    } catch (e) {
      ok = false;
    }
    if (!ok) {
      tamper('a native add-on the agent wrote or changed was loaded (' + String(filename) + ')');
      throw new ErrorC('rlsandbox grading: native add-ons written during the episode are not loaded in tests');
    }
    return ReflectApply(origDlopen, this, [module, filename, ...rest]);
  };
  const v8 = require('v8');
  for (const name of ['getHeapSnapshot', 'writeHeapSnapshot', 'setHeapSnapshotNearHeapLimit']) {
    if (typeof v8[name] === 'function') v8[name] = refuse('v8.' + name);
  }
  if (workerThreads.Worker && workerThreads.Worker.prototype.getHeapSnapshot) {
    workerThreads.Worker.prototype.getHeapSnapshot = refuse('Worker.getHeapSnapshot');
  }
  let inspectorActive = false;
  try {
    const inspector = require('inspector');
    inspectorActive = !!inspector.url();
    inspector.open = refuse('inspector.open');
    if (inspector.Session) {
      inspector.Session.prototype.connect = refuse('inspector.Session');
      inspector.Session.prototype.connectToMainThread = refuse('inspector.Session');
    }
  } catch (e) {
    // a node built without the inspector
  }
  // SIGUSR1 would start the inspector (from another process of the run too): a listener of ours
  // takes the signal instead.
  const usr1 = function rlsandboxSigusr1() { tamper('SIGUSR1 (which starts the inspector) was sent to a test process'); };
  if (isMainThread) process.on('SIGUSR1', usr1);
  // A worker given execArgv of its own would start without this guard.
  if (typeof workerThreads.Worker === 'function') {
    const OrigWorker = workerThreads.Worker;
    const guarded = class Worker extends OrigWorker {
      constructor(filename, options) {
        if (options && options.execArgv) {
          const argv = [];
          for (let i = 0; i < options.execArgv.length; i++) argv[i] = options.execArgv[i];
          argv[argv.length] = '--require';
          argv[argv.length] = GUARD_FILE;
          options = { ...options, execArgv: argv };
        }
        super(filename, options);
      }
    };
    workerThreads.Worker = guarded;
  }

  // -- The runner: keys for its children, their records checked and signed again -------------
  function takeConfig() {
    try {
      const raw = readFileSync(cfgPath);
      unlinkSync(cfgPath);
      return parseJSON(raw.toString('utf8'));
    } catch (e) {
      return null; // a second runner (the tests started one): only the first one records
    }
  }
  // The process's own stderr, fd 2 itself: a copy opened through /proc would keep an offset of its
  // own where the command sends stderr to a file (the runner's writes would overwrite the records).
  // Code under test that closes fd 2 only loses the records, and with them every pass.
  function stderrChannel() {
    return 2;
  }

  // Every child process ``label(options)`` names (a test file's, a jest worker's) gets a key of
  // its own and the configuration over a socket added to its stdio (its fd number in CHILD_ENV);
  // what it signs comes back over that socket, is checked, and is written again under this key.
  // Each child loads this file again from the report folder, which the code under test (the same
  // user, or root) can write: a file changed there would be the next child's guard, and get its
  // key. Any write changes the file's ctime (which nobody sets back), so a changed file is caught
  // before each child is keyed and once more at the end, whatever it says by then.
  const guardFileAtStart = statSync(GUARD_FILE);
  function guardFileChanged() {
    try {
      const now = statSync(GUARD_FILE);
      return now.ino !== guardFileAtStart.ino || now.ctimeMs !== guardFileAtStart.ctimeMs;
    } catch (e) {
      return true;
    }
  }
  function endRecord() {
    if (guardFileChanged()) tamper('the guard\'s own file was changed during the run (a guard of the agent\'s for the next child)');
    emit('end');
  }
  function keyChildren(cfg, label) {
    const forChild = stringify({ workspace: cfg.workspace, changed: cfg.changed || [] }) + '\n';
    const { ChildProcess } = require('child_process');
    const origSpawn = ChildProcess.prototype.spawn;
    let children = 0;
    ChildProcess.prototype.spawn = function spawnGuarded(options) {
      const named = options && options.envPairs ? label(options) : null;
      if (named === null) return ReflectApply(origSpawn, this, [options]);
      if (guardFileChanged()) {
        tamper('the guard\'s own file was changed before ' + String(named) + ' started: that process gets no key');
        return ReflectApply(origSpawn, this, [options]);
      }
      const n = children++;
      const childKey = randomKey();
      const check = signer(new Uint8ArrayC(childKey));
      const given = options.stdio || ['pipe', 'pipe', 'pipe'];
      const stdio = [];
      for (let i = 0; i < given.length; i++) stdio[i] = given[i];
      const fd = stdio.length;
      stdio[fd] = 'pipe';
      options = { ...options, stdio, envPairs: [...options.envPairs, CHILD_ENV + '=' + fd] };
      const r = ReflectApply(origSpawn, this, [options]);
      const file = String(named);
      emit('file', file, n);
      const sock = this.stdio[fd];
      if (!sock) {
        tamper('no guard channel to the process of ' + file);
        return r;
      }
      socketWrite(sock, BufferConcat([BufferFrom(childKey), BufferFrom(forChild, 'utf8')]));
      for (let i = 0; i < childKey.length; i++) childKey[i] = 0;
      let pending = '';
      let expected = 0;
      sock.setEncoding('utf8');
      sock.on('data', (chunk) => {
        pending += chunk;
        let nl;
        while ((nl = indexOf(pending, '\n')) !== -1) {
          const line = sliceStr(pending, 0, nl);
          pending = sliceStr(pending, nl + 1);
          const tab = line.lastIndexOf('\t');
          const body = tab < 0 ? line : sliceStr(line, 0, tab);
          if (tab < 0 || check(body) !== sliceStr(line, tab + 1)) {
            tamper('a record on the guard channel of ' + file + ' has a bad signature: written by the code under test');
            continue;
          }
          let rec;
          try {
            rec = parseJSON(body);
          } catch (e) {
            tamper('a signed record of ' + file + ' is unreadable');
            continue;
          }
          if (rec[0] !== expected) tamper('record ' + expected + ' of ' + file + ' is missing (found ' + rec[0] + ')');
          expected = rec[0] + 1;
          if (rec[1] === 'witness') emit('witness', file, rec[2], rec[3]);
          else if (rec[1] === 'tamper') tamper(file + ': ' + rec[2]);
          else if (rec[1] === 'exposed') emit('exposed', file + ': ' + rec[2]);
          else if (rec[1] === 'ready') emit('ready', file);
        }
      });
      sock.on('error', () => {});
      this.on('exit', (code, signal) => emit('exit', file, code === null ? -1 : code, signal || ''));
      return r;
    };
  }

  if (isRunner) {
    const cfg = takeConfig();
    if (cfg === null) return;
    sign = signer(Buffer.from(cfg.key, 'hex'));
    channel = stderrChannel();
    emit('start', process.version, 'runner');
    if (exposed) emit('exposed', exposed);
    if (inspectorActive) tamper('the inspector was active as the runner started');
    keyChildren(cfg, (options) => {
      const pairs = options.envPairs;
      for (let i = 0; i < pairs.length; i++) {
        if (startsWith(pairs[i], 'NODE_TEST_CONTEXT=')) return options.args[options.args.length - 1];
      }
      return null;
    });
    process.on('exit', endRecord);
    return;
  }

  if (!isChild && mochaRoot === null && !jestMain) return; // a worker thread: locked down, nothing to record

  // -- A test file's process: its key, then a witness of every test body ----------------------
  function keyFromRunner() {
    const keyBuf = new Uint8ArrayC(32);
    let got = 0;
    for (let tries = 0; got < 32 && tries < 10000; tries++) {
      try {
        const n = readSync(childFd, keyBuf, got, 32 - got, null);
        if (n === 0) break;
        got += n;
      } catch (e) {
        if (!e || e.code !== 'EAGAIN') break;
      }
    }
    if (got !== 32) return null; // no key: nothing this process says counts
    // Then what the runner was told: the workspace and the files the agent changed, one JSON line.
    let cfgText = '';
    {
      const one = new Uint8ArrayC(4096);
      const parts = [];
      let total = 0;
      for (let tries = 0; tries < 100000; tries++) {
        let n = 0;
        try {
          n = readSync(childFd, one, 0, one.length, null);
        } catch (e) {
          if (e && e.code === 'EAGAIN') continue;
          break;
        }
        if (n === 0) break;
        parts[parts.length] = Buffer.from(one.slice(0, n));
        total += n;
        if (one[n - 1] === 10) break;
      }
      cfgText = Buffer.concat(parts, total).toString('utf8');
    }
    let childCfg;
    try {
      childCfg = parseJSON(cfgText);
    } catch (e) {
      return null;
    }
    sign = signer(keyBuf);
    channel = childFd;
    // The child's records are JSON arrays (the runner reads them), signed with the child's key.
    emit = function emitChild(kind, ...fields) {
      let body = '[' + seq + ',' + stringify(kind);
      for (let i = 0; i < fields.length; i++) body += ',' + stringify(String(fields[i]));
      body += ']';
      seq++;
      try {
        writeSync(channel, body + '\t' + sign(body) + '\n');
      } catch (e) {
        // the channel was closed by the code under test: its witnesses are missing, nothing passes
      }
    };
    return childCfg;
  }

  let witnessCfg;
  if (isChild) {
    witnessCfg = keyFromRunner();
    if (witnessCfg === null) return;
  } else {
    witnessCfg = takeConfig();
    if (witnessCfg === null) return;
    sign = signer(Buffer.from(witnessCfg.key, 'hex'));
    channel = stderrChannel();
    emit('start', process.version, jestMain ? 'jest' : 'mocha');
    if (jestMain) keyChildren(witnessCfg, (options) => {
      const args = options.args || [];
      for (let i = 0; i < args.length; i++) if (indexOf(String(args[i]), '/jest-worker/') !== -1) return 'jest worker';
      return null;
    });
    process.on('exit', endRecord);
  }
  if (exposed) emit('exposed', exposed);
  try {
    const fromWorkers = new workerThreads.BroadcastChannel(GUARD_CHANNEL);
    fromWorkers.onmessage = (ev) => tamper('in a worker thread: ' + String(ev.data));
    fromWorkers.unref();
  } catch (e) {
    // node without BroadcastChannel: refusals in workers go unrecorded (they still stand)
  }
  if (inspectorActive) {
    tamper('the inspector was active as the test process started');
    return;
  }

  const cfgWorkspace = String(witnessCfg.workspace || process.cwd());
  // Who installs a compile hook (Module.prototype._compile, Module.wrap, a handler of
  // Module._extensions): ts-node or @babel/register from node_modules may; the agent's code, or a
  // file that appeared during the run, may not (it could strip the assertions out of every test
  // file loaded after it). The hooks become accessors that record who sets them.
  function hookSetter(label) {
    const from = setterCaller();
    if (from !== null && agentWritten(from)) tamper(label + ' was replaced by ' + from + ' (a compile hook of the agent\'s)');
  }
  function guardSlot(obj, name, label) {
    let value = obj[name];
    try {
      ObjectDefineProperty(obj, name, {
        get() { return value; },
        set(v) { hookSetter(label); value = v; },
        enumerable: true,
        configurable: false,
      });
    } catch (e) {
      // already fixed by someone: left as it is
    }
  }
  guardSlot(Module.prototype, '_compile', 'Module.prototype._compile');
  guardSlot(Module, 'wrap', 'Module.wrap');
  guardSlot(Module, 'wrapper', 'Module.wrapper');
  {
    const handlers = Module._extensions;
    Module._extensions = new Proxy(handlers, {
      set(target, key, v) { hookSetter('the ' + String(key) + ' compile handler'); target[key] = v; return true; },
      defineProperty(target, key, d) { hookSetter('the ' + String(key) + ' compile handler'); return Reflect.defineProperty(target, key, d); },
      deleteProperty(target, key) { hookSetter('the ' + String(key) + ' compile handler'); return delete target[key]; },
    });
    guardSlot(Module, '_extensions', 'Module._extensions');
  }
  const changed = ObjectCreate(null);
  const changedList = witnessCfg.changed || [];
  for (let i = 0; i < changedList.length; i++) changed[resolvePath(cfgWorkspace, String(changedList[i]))] = true;
  agentFile = (file) => changed[file] === true;

  // The assertion library and the built-ins the tests compare with, as they are now; checked
  // before every witnessed pass (a replaced assert.strictEqual passes everything).
  const watched = [];
  function own(obj, name) {
    const d = ObjectGetOwnPropertyDescriptor(obj, name);
    return d === undefined ? undefined : 'value' in d ? d.value : d.get;
  }
  // What ``names`` of ``obj`` are now (every own name: all of them); checked before each pass.
  function watchNames(label, obj, names) {
    if (obj === null || (typeof obj !== 'object' && typeof obj !== 'function')) return;
    const values = [];
    for (let i = 0; i < names.length; i++) values[i] = own(obj, names[i]);
    watched[watched.length] = [label, obj, names, values];
  }
  function watch(label, obj) {
    if (obj === null || (typeof obj !== 'object' && typeof obj !== 'function')) return;
    watchNames(label, obj, ObjectGetOwnPropertyNames(obj));
  }
  const assertMod = require('assert');
  watch('assert', assertMod);
  watch('assert.strict', assertMod.strict);
  // The built-ins an assertion library of the tests' compares with (node's assert uses node's own
  // primordials, which nothing replaces; chai and jest's expect call Object.is, Object.keys,
  // ... as they find them: one replaced makes every comparison agree). Not Date nor Math.random,
  // which tests mock themselves.
  function watchIntrinsics(realm, where) {
    const pairs = [
      ['Object', realm.Object], ['Object.prototype', realm.Object && realm.Object.prototype],
      ['Array', realm.Array], ['Array.prototype', realm.Array && realm.Array.prototype],
      ['String.prototype', realm.String && realm.String.prototype], ['Number', realm.Number],
      ['Function.prototype', realm.Function && realm.Function.prototype], ['Reflect', realm.Reflect],
      ['JSON', realm.JSON], ['Map.prototype', realm.Map && realm.Map.prototype],
      ['Set.prototype', realm.Set && realm.Set.prototype], ['RegExp.prototype', realm.RegExp && realm.RegExp.prototype],
      ['Symbol', realm.Symbol],
    ];
    for (let i = 0; i < pairs.length; i++) watch(where + pairs[i][0], pairs[i][1]);
  }
  watchIntrinsics(globalThis, '');
  // What was replaced or deleted of what is watched ('' if nothing): an added name (a plugin of the
  // tests', a matcher of theirs) changes nothing that was there.
  function intact() {
    for (let w = 0; w < watched.length; w++) {
      // (no destructuring here: it would call Array.prototype[Symbol.iterator], which the code
      // under test can replace)
      const entry = watched[w];
      const label = entry[0], obj = entry[1], names = entry[2], values = entry[3];
      for (let i = 0; i < names.length; i++) {
        const now = own(obj, names[i]);
        if (now === values[i] || (typeof now !== 'function' && typeof values[i] !== 'function')) continue;
        return label + '.' + String(names[i]) + (now === undefined ? ' was deleted' : ' was replaced');
      }
    }
    return '';
  }

  // Where a function was called from: the first frame outside this file.
  let callSiteFile = null;
  {
    const saved = ErrorC.prepareStackTrace;
    ErrorC.prepareStackTrace = (e, frames) => frames;
    const probe = {};
    captureStackTrace(probe);
    const frames = probe.stack;
    ErrorC.prepareStackTrace = saved;
    if (frames && frames.length) callSiteFile = uncurry(ObjectGetPrototypeOf(frames[0]).getFileName);
  }
  // The runner's own frames between a test file and the guard (mocha's interface, jest-each's
  // table binding), never a file the agent could have written there.
  const JEST_FRAMES = /\/(?:jest-each|jest-circus)\/build\//;
  function runnerFrame(f) {
    if (mochaRoot !== null && startsWith(f, mochaRoot)) return true;
    if (!JEST_FRAMES.test(f)) return false;
    return !startsWith(f, cfgWorkspace + '/') || indexOf(f, '/node_modules/') !== -1;
  }
  // The files of the frames that led here, innermost first, past this file, node's own and the
  // runner's; null if the stack cannot be read (someone owns Error.prepareStackTrace).
  function stackFiles() {
    if (callSiteFile === null) return null;
    const saved = ErrorC.prepareStackTrace;
    const savedLimit = ErrorC.stackTraceLimit;
    let frames = null;
    try {
      const mine = (e, f) => f;
      ErrorC.prepareStackTrace = mine;
      if (ErrorC.prepareStackTrace !== mine) return null;
      ErrorC.stackTraceLimit = 200;
      const probe = {};
      captureStackTrace(probe);
      frames = probe.stack;
    } catch (e) {
      return null;
    } finally {
      try { ErrorC.prepareStackTrace = saved; ErrorC.stackTraceLimit = savedLimit; } catch (e) { /* theirs */ }
    }
    if (!frames || typeof frames.length !== 'number') return null;
    const files = [];
    for (let i = 0; i < frames.length; i++) {
      let f = callSiteFile(frames[i]);
      if (!f || f === GUARD_FILE || startsWith(f, 'node:') || runnerFrame(f)) continue;
      if (startsWith(f, 'file:')) {
        try {
          f = fileURLToPath(f);
        } catch (e) {
          return null;
        }
      }
      files[files.length] = f;
    }
    return files;
  }
  function caller() {
    const files = stackFiles();
    return files === null || files.length === 0 ? null : files[0];
  }
  // Where a test is registered from: a test file, with no file of the agent's on the way (a test
  // file's helper that registers tests, called by the agent's code, registers the agent's test).
  // ``from``: the innermost frame of the workspace outside node_modules (a helper library of the
  // tests', from node_modules, may stand between: mocha-each, say).
  function registeredFrom() {
    const files = stackFiles();
    if (files === null) return { from: null, agent: null };
    let from = null;
    for (let i = 0; i < files.length; i++) {
      const f = files[i];
      if (agentWritten(f)) return { from: from || f, agent: f };
      if (from === null && startsWith(f, cfgWorkspace + '/') && indexOf(f, '/node_modules/') === -1) from = f;
    }
    return { from, agent: null };
  }
  // The agent's: a file it changed, or one that appeared or changed during the run (written by
  // code under test), wherever it is.
  const seenFiles = ObjectCreate(null);
  function agentWritten(file) {
    if (changed[file]) return true;
    if (!(file in seenFiles)) {
      let fresh = true;
      try {
        fresh = statSync(file).mtimeMs >= startedAt;
      } catch (e) {
        fresh = true; // gone, or not a file: not one that was there
      }
      seenFiles[file] = fresh;
    }
    return seenFiles[file];
  }
  function setterCaller() {
    return caller();
  }
  function fromTestFile(file) {
    if (file === null || !isAbsolute(file)) return false;
    if (changed[file]) return false;
    const ws = cfgWorkspace + '/';
    return startsWith(file, ws) && indexOf(file, '/node_modules/') === -1;
  }

  function witness(id, outcome, file) {
    if (outcome === 'passed') {
      const broken = intact();
      if (broken) {
        tamper(broken + ' during the test run');
        outcome = 'error'; // not the test's failure: the guard's verdict (tampering says why)
      }
    }
    if (isChild) emit('witness', id, outcome); // the runner knows the file
    else emit('witness', file, id, outcome);
  }

  const suites = []; // names of the describe blocks being registered
  function pathOf(name) {
    let id = '';
    for (let i = 0; i < suites.length; i++) id += suites[i] + ' > ';
    return id + name;
  }
  function testName(args, fn) {
    if (typeof args[0] === 'string') return args[0];
    if (typeof fn === 'function' && fn.name) return fn.name;
    return '<anonymous>';
  }
  function lastFunction(args) {
    for (let i = args.length - 1; i >= 0; i--) if (typeof args[i] === 'function') return i;
    return -1;
  }

  // A test body as the runner will call it, reporting how it ended.
  // ``doneAt``: where the runner passes a done callback to a function that takes one (node:test:
  // second, after its context; mocha and jest: first). ``id``: the test's id, or a function that
  // tells it as the test runs (jest, whose runner knows it then).
  function witnessed(given, fn, file, doneAt) {
    const wrapper = function (...args) {
      const id = typeof given === 'function' ? given() : given;
      const t = args[0];
      if (t && typeof t === 'object' && typeof t.test === 'function') {
        const sub = t.test;
        try {
          ObjectDefineProperty(t, 'test', { value: registrar(sub, 'test', id + ' > '), configurable: true, writable: true });
        } catch (e) {
          // a context that cannot take it: its subtests go unwitnessed (they do not pass)
        }
      }
      if (fn.length > doneAt && typeof args[doneAt] === 'function') {
        const done = args[doneAt];
        args[doneAt] = function (err) {
          witness(id, err ? 'failed' : 'passed', file);
          return ReflectApply(done, this, arguments);
        };
        try {
          return ReflectApply(fn, this, args);
        } catch (e) {
          witness(id, 'failed', file);
          throw e;
        }
      }
      let r;
      try {
        r = ReflectApply(fn, this, args);
      } catch (e) {
        witness(id, 'failed', file);
        throw e;
      }
      if (r !== null && (typeof r === 'object' || typeof r === 'function') && typeof r.then === 'function') {
        return new Promise((resolve, reject) => {
          ReflectApply(r.then, r, [
            (v) => { witness(id, 'passed', file); resolve(v); },
            (e) => { witness(id, 'failed', file); reject(e); },
          ]);
        });
      }
      witness(id, 'passed', file);
      return r;
    };
    ObjectDefineProperty(wrapper, 'length', { value: fn.length });
    ObjectDefineProperty(wrapper, 'name', { value: fn.name });
    return wrapper;
  }

  // test/it/describe (and their .skip/.todo/.only) as the test files call them.
  // ``style``: where the runner passes a done callback, and the file part of the runner's ids
  // (jest's: "file > describe > test", the file relative to the workspace; node:test's: none).
  const NODE_STYLE = { doneAt: 1, file: '' };
  function registrar(orig, kind, prefix, style = NODE_STYLE) {
    const reg = function (...args) {
      const i = lastFunction(args);
      const fn = i >= 0 ? args[i] : undefined;
      const name = testName(args, fn);
      const id = prefix === undefined ? (style.file ? style.file + ' > ' : '') + pathOf(name) : prefix + name;
      const { from, agent } = registeredFrom();
      if (prefix === undefined && (!fromTestFile(from) || agent !== null)) {
        const where = agent !== null ? 'through ' + agent + ', a file of the agent\'s' : 'from ' + (from || 'an unknown place') + ', not from a test file';
        tamper('a test (' + id + ') was registered ' + where);
        return ReflectApply(orig, this, args); // it runs, and nothing it does is witnessed
      }
      if (i >= 0) {
        if (kind === 'describe') {
          args[i] = function (...a) {
            suites[suites.length] = name;
            try {
              return ReflectApply(fn, this, a);
            } finally {
              suites.length = suites.length - 1;
            }
          };
        } else {
          args[i] = witnessed(id, fn, from, style.doneAt);
        }
      }
      return ReflectApply(orig, this, args);
    };
    for (const variant of ['skip', 'todo', 'only', 'failing']) {
      if (typeof orig[variant] === 'function') reg[variant] = registrar(orig[variant], kind, prefix, style);
    }
    return reg;
  }

  // mocha: every test a test file adds to a suite, witnessed the same way (its id is mocha's full
  // title, as its TAP reporter prints it).
  let mochaHooked = false;
  function hookMocha(Suite) {
    if (mochaHooked || typeof Suite !== 'function' || Suite.name !== 'Suite' || !Suite.prototype) return;
    const addTest = Suite.prototype.addTest;
    if (typeof addTest !== 'function') return;
    mochaHooked = true;
    Suite.prototype.addTest = function (test) {
      if (test && typeof test.fn === 'function') {
        let id = String(test.title);
        for (let p = this; p && !p.root; p = p.parent) id = String(p.title) + ' ' + id;
        const { from, agent } = registeredFrom();
        if (!fromTestFile(from) || agent !== null) {
          const where = agent !== null ? 'through ' + agent + ', a file of the agent\'s' : 'from ' + (from || 'an unknown place') + ', not from a test file';
          tamper('a test (' + id + ') was registered ' + where);
        } else {
          test.fn = witnessed(id, test.fn, from, 0);
        }
      }
      return ReflectApply(addTest, this, [test]);
    };
  }
  // Assertion libraries the tests load are watched like node's assert (chai's methods live on
  // its Assertion's prototype).
  const watchedLibs = ObjectCreate(null);
  function watchLibrary(request, exp) {
    if (request !== 'chai' || watchedLibs[request] || !exp || typeof exp !== 'object') return;
    watchedLibs[request] = true;
    watch('chai', exp);
    if (exp.Assertion && exp.Assertion.prototype) watch('chai.Assertion.prototype', exp.Assertion.prototype);
    if (exp.assert) watch('chai.assert', exp.assert);
  }

  // jest: each test file runs in a fresh context of jest-runtime's, where jest-circus's
  // initialize sets the globals (test, it, describe, expect); they are witnessed as they are set,
  // .each through jest-each's own title formatting over the witnessed ones, and expect's matchers
  // are watched like an assertion library (expect.extend replacing toBe passes everything).
  let jestHooked = false;
  function hookJest(Runtime) {
    const proto = Runtime && Runtime.prototype;
    if (jestHooked || !proto || typeof proto.requireInternalModule !== 'function') return;
    jestHooked = true;
    const requireInternal = proto.requireInternalModule;
    proto.requireInternalModule = function (...args) {
      const m = ReflectApply(requireInternal, this, args);
      if (!m || typeof m.initialize !== 'function' || typeof m.runAndTransformResultsToJestFormat !== 'function') return m;
      const initialize = m.initialize;
      return {
        ...m,
        initialize: async (opts) => {
          const setGlobals = opts.setGlobalsForRuntime;
          const file = pathMod.relative(cfgWorkspace, String(opts.testPath));
          let eachOf = null;
          try {
            eachOf = Module.createRequire(String(args[1] || args[0] || GUARD_FILE))('jest-each').bind;
          } catch (e) {
            eachOf = null; // no jest-each beside jest-circus: .each tests go unwitnessed
          }
          const style = { doneAt: 0, file };
          const mine = {
            ...opts,
            setGlobalsForRuntime: (globals) => {
              for (const name of ['test', 'it', 'fit', 'xit', 'xtest', 'describe', 'fdescribe', 'xdescribe']) {
                const orig = globals[name];
                if (typeof orig !== 'function') continue;
                const kind = indexOf(name, 'describe') !== -1 ? 'describe' : 'test';
                const reg = registrar(orig, kind, undefined, style);
                if (eachOf !== null && typeof orig.each === 'function') reg.each = eachOf(reg, kind !== 'describe');
                for (const k of ObjectGetOwnPropertyNames(orig)) if (!(k in reg)) reg[k] = orig[k];
                globals[name] = reg;
              }
              return setGlobals(globals);
            },
          };
          const out = await initialize(mine);
          const g = opts.environment && opts.environment.global;
          const matchers = g && g[SymbolFor('$$jest-matchers-object')];
          if (matchers && matchers.matchers) watch('expect', matchers.matchers);
          if (g) watchNames('the test globals', g, ['expect', 'test', 'it', 'describe']);
          if (g) watchIntrinsics(g, 'the test context\'s ');
          return out;
        },
      };
    };
  }

  let nodeTest = null;
  let facade = null;
  if (isChild) {
    nodeTest = require('node:test');
    facade = registrar(nodeTest, 'test');
    for (const name of ObjectGetOwnPropertyNames(nodeTest)) {
      if (name === 'length' || name === 'name' || name === 'prototype') continue;
      const value = nodeTest[name];
      let mine = value;
      if (name === 'test') mine = facade;
      else if (name === 'it') mine = registrar(value, 'test');
      else if (name === 'describe' || name === 'suite') mine = registrar(value, 'describe');
      if (!(name in facade) || name === 'test') facade[name] = mine;
      try {
        nodeTest[name] = mine; // named imports (ESM) and test.it read these
      } catch (e) {
        // read-only: that name goes unwitnessed
      }
    }
  }
  const origLoad = Module._load;
  Module._load = function (request, ...rest) {
    const exp = ReflectApply(origLoad, this, [request, ...rest]);
    if (nodeTest !== null && exp === nodeTest) return facade;
    if (mochaRoot !== null && !mochaHooked) hookMocha(exp);
    if (!jestHooked && exp && typeof exp.default === 'function') hookJest(exp.default);
    if (typeof request === 'string' && request === 'chai') watchLibrary(request, exp);
    return exp;
  };

  // ES modules import node:test without Module._load: a resolve hook (node >= 18.19) sends
  // `node:test` to a module that re-exports the same witnessed functions. A hook the code under
  // test registers later runs first and may send it back to the builtin: those tests then go
  // unwitnessed, and pass nothing.
  // Only where the test file is an ES module (a loader thread costs ~60 ms a file): .mjs, or .js
  // under a package.json of "type": "module" (one the agent changed only breaks its own tests).
  function esModule(file) {
    if (typeof file !== 'string') return false;
    if (endsWith(file, '.mjs') || endsWith(file, '.mts')) return true;
    if (endsWith(file, '.cjs') || endsWith(file, '.cts')) return false;
    for (let dir = pathMod.dirname(resolvePath(file)); ; dir = pathMod.dirname(dir)) {
      try {
        return parseJSON(readFileSync(dir + '/package.json', 'utf8')).type === 'module';
      } catch (e) {
        if (e && e.code !== 'ENOENT' && e.code !== 'ENOTDIR') return true; // unreadable: assume so
      }
      if (dir === '/' || dir === '.') return false;
    }
  }
  if (isChild && typeof Module.register === 'function' && esModule(process.argv[1])) {
    const names = [];
    for (const name of ObjectGetOwnPropertyNames(nodeTest)) {
      if (name !== 'length' && name !== 'name' && name !== 'prototype' && /^[A-Za-z_$][\w$]*$/.test(name)) names[names.length] = name;
    }
    const shim = 'data:text/javascript,' + encodeURIComponent(
      "import { createRequire } from 'node:module';\n" +
      'const t = createRequire(' + stringify(GUARD_FILE) + ")('node:test');\n" +
      'export default t;\nexport const { ' + names.join(', ') + ' } = t;\n');
    const hooks = 'export async function resolve(specifier, context, next) {\n' +
      "  if (specifier === 'node:test' && !String(context.parentURL || '').startsWith('data:')) " +
      'return { url: ' + stringify(shim) + ', shortCircuit: true };\n' +
      '  return next(specifier, context);\n}\n';
    try {
      Module.register('data:text/javascript,' + encodeURIComponent(hooks));
    } catch (e) {
      tamper('could not witness tests of ES modules: ' + String(e && e.message));
    }
  }
  emit('ready');
})();
