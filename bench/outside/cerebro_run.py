"""cerebro_db cold + warm fit in one fresh session. Usage: cerebro_run.py WORKLOAD TAG"""
import json
import os
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CONN

wl, tag = sys.argv[1], sys.argv[2]
user = sys.argv[3] if len(sys.argv) > 3 else 'cerebro_outside'
src, val, mst, iters = {'A': ('fm_train_packed', 'fm_test_packed', 'mst_mlp', 3),
                        'B': ('fm_train_packed', 'fm_test_packed', 'mst_cnn', 2),
                        'C': ('fm_train20k_packed', 'fm_test20k_packed', 'mst_mlp', 3)}[wl]
def rss(pid):
    d = {}
    try:
        with open(f'/proc/{pid}/status') as f:
            lines = f.readlines()
        for line in lines:
            k = line.split(':')[0]
            if k in ('VmRSS', 'VmHWM', 'RssAnon'):
                d[k] = int(line.split()[1]) // 1024
    except OSError:
        pass
    return d
mon = psycopg2.connect(**CONN); mon.autocommit = True
mcur = mon.cursor()
c = psycopg2.connect(**dict(CONN, user=user)); c.autocommit = True
cur = c.cursor()
t_conn0 = time.time()
cur.execute('SELECT pg_backend_pid()'); coord = cur.fetchone()[0]
peaks = {}
stop = threading.Event()
def sampler():
    while not stop.is_set():
        mcur.execute("SELECT pid, application_name FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()")
        for pid, app in mcur.fetchall():
            r = rss(pid)
            role = 'coordinator' if pid == coord else ('worker' if 'cerebro' in (app or '') else None)
            if role is None or not r: continue
            p = peaks.setdefault(pid, {'role': role, 'app': app, 'VmRSS': 0, 'RssAnon': 0, 'VmHWM': 0})
            for k in ('VmRSS', 'RssAnon', 'VmHWM'): p[k] = max(p[k], r.get(k, 0))
        time.sleep(0.1)
th = threading.Thread(target=sampler, daemon=True); th.start()
out = {}
for which in ('cold', 'warm'):
    name = f'out_{wl}_{tag}_{which}'.lower()
    cur.execute(f'DROP TABLE IF EXISTS {name}, {name}_summary, {name}_info')
    del c.notices[:]
    load = os.getloadavg()[0]
    t0 = time.time()
    cur.execute(f"SELECT madlib_keras_fit_multiple_model('{src}', '{name}', '{mst}', {iters}, "
                f"validation_table => '{val}', metrics_compute_frequency => 1)")
    dt = time.time() - t0
    cur.execute(f"""SELECT f.fit_id, extract(epoch from f.ended_at - f.started_at),
        extract(epoch from (SELECT min(started_at) FROM cerebro_db.units u WHERE u.fit_id = f.fit_id)) - %s,
        f.options FROM cerebro_db.fits f WHERE model_output_table LIKE '%%{name}' ORDER BY fit_id DESC LIMIT 1""", (t0,))
    fit_id, catalog_span, first_unit, options = cur.fetchone()
    cur.execute(f"SELECT max(validation_metrics_final), max(training_metrics_final), count(*) FROM {name}_info")
    best_val, best_train, n_info = cur.fetchone()
    cur.execute(f"""SELECT kind, count(*), round(sum(extract(epoch from ended_at-started_at))::numeric,2),
        round(sum(seconds_load)::numeric,2), round(sum(seconds_run)::numeric,2), round(sum(seconds_save)::numeric,2)
        FROM cerebro_db.units WHERE fit_id = {fit_id} GROUP BY kind ORDER BY kind""")
    kinds = cur.fetchall()
    out[which] = {'s': round(dt, 2), 'fit_id': fit_id, 'catalog_span': float(catalog_span), 'first_unit_s': float(first_unit),
                      'best_val_acc': best_val, 'best_train_acc': best_train, 'n_info': n_info, 'kinds': [[float(x) if hasattr(x, 'as_tuple') else x for x in k] for k in kinds],
                      'notices': [n.strip()[:300] for n in (c.notices[:1] + c.notices[-1:])], 'load1': load, 'replicas': options.get('replicas') if isinstance(options, dict) else None}
stop.set(); th.join()
print(json.dumps(dict(system='cerebro', wl=wl, tag=tag, user=user, coord_pid=coord, **out,
                      peaks={str(k): v for k, v in peaks.items()})))
