// The dashboard page's script (GET /): asks for a token when the broker wants one, loads each
// view (GET /dashboard/view/...) into the page and refreshes it while the page is shown (the
// refresh timer stops when the tab is hidden or left, and a view is loaded again on return),
// and runs the views' buttons (data-action) and filter forms (data-nav). Served as a file of
// its own: the page's Content-Security-Policy lets no inline script or event handler run.
(function () {
  "use strict";
  var KEY = "queen-dashboard-token", REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;
  var main = document.getElementById("main"), status = document.getElementById("status");
  var login = document.getElementById("login"), signout = document.getElementById("signout");
  var toastBox = document.getElementById("toast"), toastTimer = null, loading = false, again = false;
  var refresh = null;   // the refresh timer, while the page is shown

  function token() { return sessionStorage.getItem(KEY) || ""; }
  function headers(extra) {
    var h = extra || {}; var t = token();
    if (t) { h["Authorization"] = "Bearer " + t; }
    return h;
  }
  function route() { return location.hash.replace(/^#/, "") || "/overview"; }
  function toast(text, ok) {
    toastBox.textContent = text; toastBox.className = ok ? "ok" : "bad"; toastBox.style.display = "block";
    clearTimeout(toastTimer); toastTimer = setTimeout(function () { toastBox.style.display = "none"; }, 4000);
  }
  function markNav(path) {
    var page = path.split(/[/?]/)[1];
    if (page === "queue") { page = "overview"; } else if (page === "message") { page = "messages"; }
    document.querySelectorAll("nav a").forEach(function (a) { a.classList.toggle("active", a.dataset.page === page); });
  }
  function roles(j) {
    return j && j.required && j.required.length ? " (needs the " + j.required.join(" and ") + " role)" : "";
  }
  function askToken(code, j) {
    var why = "This broker requires a token. It is kept in this tab only and sent with every call.";
    if (code === 403) {
      why = "This token may not read the broker: " + ((j && j.error) || "refused") + roles(j) + ". Try another one.";
    } else if (token() && j && j.error) {
      why = "The token was refused: " + j.error + ". Paste another one.";
    }
    document.getElementById("login-why").textContent = why;
    login.classList.add("shown"); main.innerHTML = ""; status.textContent = "signed out";
  }
  function showError(code, text, type) {
    // The answer's words only, never its markup: a JSON error's text, or an HTML page's text.
    var said = text;
    if (/json/.test(type || "")) {
      try { said = JSON.parse(text).error || text; } catch (e) { said = text; }
    } else if (/html/.test(type || "")) {
      said = new DOMParser().parseFromString(text, "text/html").body.textContent;
    }
    var box = document.createElement("div");
    box.className = "error-box";
    box.textContent = code + ": " + said.trim();
    main.replaceChildren(box);
  }
  function load() {
    if (document.hidden) { return; }          // a hidden tab asks nothing: loaded on return
    if (loading) { again = true; return; }   // navigated meanwhile: load once this one ends
    loading = true; again = false;
    var path = route();
    fetch("/dashboard/view" + path, { headers: headers({ "Accept": "text/html" }) }).then(function (resp) {
      if (resp.status === 401 || resp.status === 403) {
        return resp.text().then(function (text) {
          var j = null; try { j = JSON.parse(text); } catch (e) { j = null; }
          askToken(resp.status, j);
        });
      }
      return resp.text().then(function (html) {
        login.classList.remove("shown");
        if (resp.ok) { main.innerHTML = html; } else { showError(resp.status, html, resp.headers.get("Content-Type")); }
        main.dataset.route = path;
        status.className = ""; status.textContent = "updated " + new Date().toLocaleTimeString();
        signout.hidden = !token(); markNav(path);
      });
    }).catch(function () {
      status.className = "bad"; status.textContent = "broker unreachable";
    }).then(function () { loading = false; if (again) { load(); } });
  }
  function busy() {
    var a = document.activeElement;
    return document.hidden || login.classList.contains("shown") || main.querySelector("[data-static]") ||
      (a && main.contains(a) && /INPUT|SELECT|TEXTAREA/.test(a.tagName));
  }
  function startRefresh() {
    if (refresh === null && !document.hidden) {
      refresh = setInterval(function () { if (!busy()) { load(); } }, REFRESH_MS);
    }
  }
  function stopRefresh() {
    if (refresh !== null) { clearInterval(refresh); refresh = null; }
  }
  function shown() { startRefresh(); load(); }   // back on the page: show it as it is now
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stopRefresh(); } else { shown(); }
  });
  window.addEventListener("pagehide", stopRefresh);   // left (or kept in the back/forward cache)
  window.addEventListener("pageshow", function (ev) { if (ev.persisted) { shown(); } });
  window.addEventListener("hashchange", load);

  login.addEventListener("submit", function (ev) {
    ev.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = ""; load();
  });
  signout.addEventListener("click", function () { sessionStorage.removeItem(KEY); askToken(401); });

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("[data-action]");
    if (!b) { return; }
    ev.preventDefault();
    if (b.dataset.confirm && !window.confirm(b.dataset.confirm)) { return; }
    var init = { method: b.dataset.method || "POST", headers: headers({ "Content-Type": "application/json" }) };
    if (b.dataset.body) { init.body = b.dataset.body; }
    if (b.dataset.fields) {
      var form = b.closest("form"), body = b.dataset.body ? JSON.parse(b.dataset.body) : {}, missing = null;
      b.dataset.fields.split(",").forEach(function (name) {
        var input = form && form.elements[name], v = input ? input.value : "";
        if (!v) { missing = name; return; }
        // datetime-local inputs are read as UTC
        body[name] = input.type === "datetime-local" ? v + (v.length === 16 ? ":00" : "") + "Z" : v;
      });
      if (missing) { toast("fill in " + missing + " first", false); return; }
      init.body = JSON.stringify(body);
    }
    fetch(b.dataset.action, init).then(function (resp) {
      return resp.text().then(function (text) {
        var said = text;
        try { var j = JSON.parse(text); said = (j.error || j.message || (j.success === false ? "refused" : "done")) + roles(j); } catch (e) { said = text || resp.statusText; }
        toast((resp.ok ? "" : resp.status + ": ") + said, resp.ok);
        if (resp.ok && b.dataset.after) { location.hash = b.dataset.after; } else { load(); }
      });
    }).catch(function () { toast("broker unreachable", false); });
  });
  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    if (f.dataset.nav) {
      ev.preventDefault();
      var p = new URLSearchParams();
      new FormData(f).forEach(function (v, k) { if (v) { p.set(k, v); } });
      var q = p.toString(); location.hash = f.dataset.nav + (q ? "?" + q : "");
    }
  });
  startRefresh(); load();
})();
