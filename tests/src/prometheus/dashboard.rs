//! The PromQL of a Grafana dashboard (JSON model): every panel query and every query
//! variable, with Grafana's variables replaced by values, so a test can parse each with
//! promtool and run it on a real Prometheus.

use serde_json::Value;

/// One query of a panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelQuery {
    /// The panel's title.
    pub panel: String,
    /// The target's `refId`.
    pub ref_id: String,
    /// The PromQL, as written (with Grafana variables).
    pub expr: String,
}

/// Every `targets[].expr` of every panel, rows' nested panels included, in order.
pub fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    fn walk(panels: &Value, out: &mut Vec<PanelQuery>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(PanelQuery {
                        panel: title.to_string(),
                        ref_id: target["refId"].as_str().unwrap_or_default().to_string(),
                        expr: expr.to_string(),
                    });
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The query variables (`templating.list[]` of type `query`): name and query text.
pub fn variable_queries(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .filter_map(|v| {
            let query = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())?;
            Some((v["name"].as_str()?.to_string(), query.to_string()))
        })
        .collect()
}

/// `label_values(SELECTOR, LABEL)`: the selector and the label, if `query` is one.
pub fn label_values(query: &str) -> Option<(String, String)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_string(), label.trim().to_string()))
}

/// `expr` with each `$name` and `${name}` of `values` replaced (longer names first, so
/// `$__rate_interval` is not read as `$__rate`).
pub fn substitute(expr: &str, values: &[(&str, &str)]) -> String {
    let mut values = values.to_vec();
    values.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_string();
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value);
        out = out.replace(&format!("${name}"), value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_variables_and_substitution() {
        let dashboard = serde_json::json!({
            "panels": [
                {"type": "row", "title": "r", "panels": [
                    {"title": "nested", "targets": [{"refId": "A", "expr": "up{ns=\"$namespace\"}"}]}
                ]},
                {"title": "top", "targets": [{"refId": "A", "expr": "rate(x[$__rate_interval])"}, {"refId": "B"}]},
            ],
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "namespace", "type": "query", "query": {"query": "label_values(up{job=\"etcd\"}, namespace)"}},
            ]},
        });
        let q = panel_queries(&dashboard);
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].panel, "nested");
        assert_eq!(q[1].expr, "rate(x[$__rate_interval])");
        let vars = variable_queries(&dashboard);
        assert_eq!(vars.len(), 1);
        assert_eq!(
            label_values(&vars[0].1),
            Some(("up{job=\"etcd\"}".to_string(), "namespace".to_string()))
        );
        assert_eq!(
            substitute(
                "rate(x{a=\"${namespace}\"}[$__rate_interval]) $__rate",
                &[
                    ("__rate", "R"),
                    ("__rate_interval", "1m"),
                    ("namespace", "apps")
                ]
            ),
            "rate(x{a=\"apps\"}[1m]) R"
        );
    }
}
